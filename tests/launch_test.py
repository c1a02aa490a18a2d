"""launch/tpu_vm.py: each preset's dry run, and the gin of what it would run.

The dry runs run with a PATH whose only commands are fakes that leave a mark,
so a dry run that called gcloud (or anything else) fails the test. The
`python -m spec_decode.run` command each one prints is parsed back with
shlex, and its gin files and bindings are parsed with gin as run.py would,
so the launcher cannot drift from the configs or the run's configurables.
"""

import os
import pathlib
import re
import shlex
import stat
import subprocess
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import gin

from spec_decode import gin_config

# What run.py imports, for the configurables a run binds.
# pylint: disable=unused-import,g-bad-import-order
from spec_decode import compare
from spec_decode import data
from spec_decode import distributed
from spec_decode import partitioning
from spec_decode import vocabulary

# pylint: enable=unused-import,g-bad-import-order

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_SCRIPT = _ROOT / "launch" / "tpu_vm.py"
# Preset: (accelerator type, TPU software version, hosts, chips). Cloud TPU
# facts (https://cloud.google.com/tpu/docs/runtimes), kept apart from the
# launcher's own tables on purpose.
_PRESETS = {
    "v4-8": ("v4-8", "tpu-ubuntu2204-base", 1, 4),
    "v5e-8": ("v5litepod-8", "v2-alpha-tpuv5-lite", 1, 8),
    "v4-32": ("v4-32", "tpu-ubuntu2204-base", 4, 16),
}
_TPU_VM = ["gcloud", "compute", "tpus", "tpu-vm"]
_FAKES = ("gcloud", "gsutil", "git", "tar", "bash", "sh", "mkdir", "ssh", "scp")


def _setup_pin(name):
  match = re.search(rf"\"{name}==([^\"]+)\"", (_ROOT / "setup.py").read_text())
  return match[1]


def _after(argv, prefix):
  """The values of every `prefix...` argument, prefix removed."""
  return [a[len(prefix) :] for a in argv if a.startswith(prefix)]


def _run_commands(command):
  """Each `python -m spec_decode.run` in a shell command: (files, bindings)."""
  words = shlex.split(command)
  runs = []
  for i in range(len(words) - 2):
    if words[i + 1 : i + 3] == ["-m", "spec_decode.run"]:
      args = []
      for word in words[i + 3 :]:
        if word in ("&&", "||", ";", "|"):
          break
        args.append(word)
      unknown = [
          a
          for a in args
          if not a.startswith(("--gin_file=", "--gin_bindings="))
      ]
      if unknown:
        raise AssertionError(f"unexpected spec_decode.run args {unknown}")
      runs.append(
          (_after(args, "--gin_file="), _after(args, "--gin_bindings="))
      )
  return runs


class LaunchTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = pathlib.Path(tempfile.mkdtemp())
    cls.fake_bin = cls.tmp / "bin"
    cls.fake_bin.mkdir()
    cls.mark = cls.tmp / "called"
    for fake in _FAKES:
      path = cls.fake_bin / fake
      path.write_text(f'#!/bin/sh\necho "{fake} $*" >> "{cls.mark}"\nexit 1\n')
      path.chmod(path.stat().st_mode | stat.S_IXUSR)
    cls.empty_bin = cls.tmp / "empty"
    cls.empty_bin.mkdir()

  def tearDown(self):
    gin.clear_config()
    if self.mark.exists():
      self.fail(f"the launcher ran commands: {self.mark.read_text()}")
    super().tearDown()

  def _launch(self, *args, path=None):
    env = dict(os.environ, PATH=str(path or self.fake_bin))
    return subprocess.run(
        [sys.executable, str(_SCRIPT), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=self.tmp,  # Not the repository: paths come from the script's.
        env=env,
    )

  def _dry_run(self, *args):
    done = self._launch("--dry_run", *args)
    self.assertEqual(done.returncode, 0, done.stderr)
    return [
        shlex.split(line)
        for line in done.stdout.splitlines()
        if line and not line.startswith("#")
    ]

  def _parse_run(self, commands):
    """The one spec_decode.run command, run on every worker; parsed."""
    runs = [
        (argv, run)
        for argv in commands
        for command in _after(argv, "--command=")
        for run in _run_commands(command)
    ]
    self.assertLen(runs, 1)
    argv, (files, bindings) = runs[0]
    self.assertEqual(argv[:5], _TPU_VM + ["ssh"])
    self.assertIn("--worker=all", argv)
    self.assertNotEmpty(files)
    # The worker runs it from the repository's root.
    files = [str(_ROOT / f) if (_ROOT / f).is_file() else f for f in files]
    gin_config.parse(files, bindings)
    return argv

  @parameterized.named_parameters((c.replace("-", "_"), c) for c in _PRESETS)
  def test_preset(self, config):
    accelerator_type, version, hosts, chips = _PRESETS[config]
    commands = self._dry_run(f"--config={config}")
    for argv in commands:
      self.assertIn(argv[0], ("gcloud", "bash", "mkdir"))
      if argv[0] == "gcloud":
        self.assertLen(_after(argv, "--zone="), 1)
    name = f"spec-decode-{config}"

    (create,) = [a for a in commands if a[:5] == _TPU_VM + ["create"]]
    self.assertEqual(create[5], name)
    self.assertIn(f"--accelerator-type={accelerator_type}", create)
    self.assertIn(f"--version={version}", create)

    # Installed on every worker, with jax[tpu] at setup.py's pins.
    (install,) = [
        c
        for a in commands
        for c in _after(a, "--command=")
        if "pip install" in c
    ]
    self.assertEqual(_setup_pin("jax"), _setup_pin("jaxlib"))
    self.assertIn(f"jax[tpu]=={_setup_pin('jax')}", shlex.split(install))
    self.assertIn("python3.11 -m venv", install)

    run = self._parse_run(commands)
    self.assertEqual(run[5], name)
    self.assertEqual(gin.query_parameter("make_mesh.model_parallel"), chips)
    self.assertEqual(
        gin.query_parameter("initialize_distributed.enabled"), hosts > 1
    )
    self.assertEqual(gin.query_parameter("run.gamma"), 7)
    self.assertEqual(gin.query_parameter("run.batch_size"), 1)
    self.assertEqual(gin.query_parameter("read_inputs.task"), "wmt_t2t_en_de")
    output_dir = gin.query_parameter("run.output_dir")
    self.assertEqual(output_dir, f"results/{name}")

    # Worker 0's output_dir comes back; nothing is deleted unless asked.
    (fetch,) = [a for a in commands if "--worker=0" in a]
    self.assertEqual(fetch[:6], _TPU_VM + ["scp", "--recurse"])
    self.assertEqual(fetch[6], f"{name}:spec_decode/{output_dir}")
    self.assertFalse([a for a in commands if "delete" in a])

  def test_flags(self):
    commands = self._dry_run(
        "--config=v4-32",
        "--project=my-project",
        "--zone=us-central2-b",
        "--name=my-tpu",
        "--model_parallel=4",
        "--gin_file=configs/t5_1_1_xxl_small_cnndm.gin",
        "--gin_bindings=target/checkpoint_path.path='gs://my-bucket/xxl'",
        "--gin_bindings=run.temperature = 1.0",
        "--output_dir=gs://my-bucket/runs",
        "--repo=https://github.com/example/spec_decode.git",
        "--ref=v1",
        "--spot",
        "--delete_after",
    )
    for argv in commands:
      self.assertEqual(argv[0], "gcloud")  # Nothing to pack: a git clone.
      self.assertIn("--project=my-project", argv)
      self.assertIn("my-tpu", " ".join(argv))
    self.assertIn("--spot", commands[0])
    self.assertEqual(commands[-1][4:6], ["delete", "my-tpu"])
    self.assertIn("--quiet", commands[-1])
    install = _after(commands[1], "--command=")[0]
    self.assertIn(
        "git clone --quiet https://github.com/example/spec_decode.git", install
    )
    self._parse_run(commands)
    self.assertEqual(gin.query_parameter("make_mesh.model_parallel"), 4)
    self.assertTrue(gin.query_parameter("initialize_distributed.enabled"))
    self.assertEqual(gin.query_parameter("run.gamma"), 5)  # CNN/DM's.
    self.assertEqual(gin.query_parameter("run.temperature"), 1.0)
    self.assertEqual(
        gin.query_parameter("target/checkpoint_path.path"),
        "gs://my-bucket/xxl",
    )
    (upload,) = [
        c
        for a in commands
        if "--worker=0" in a
        for c in _after(a, "--command=")
    ]
    self.assertEqual(
        shlex.split(upload),
        [
            "gcloud",
            "storage",
            "cp",
            "--recursive",
            "~/spec_decode/results/my-tpu",
            "gs://my-bucket/runs/",
        ],
    )

  @parameterized.parameters(
      (["--config=v9-8"], "unknown --config 'v9-8'"),
      ([], "--config is required"),
      (["--config=v4-8", "--model_parallel=3"], "must divide the 4 chips"),
      (["--config=v4-8", "--gin_file=nope.gin"], "gin file 'nope.gin'"),
      (["--config=v4-8", "--steps=create,go"], "bad --steps"),
  )
  def test_error_is_one_line(self, args, message):
    done = self._launch("--dry_run", *args)
    self.assertEqual(done.returncode, 1)
    self.assertEqual(done.stdout, "")
    self.assertLen(done.stderr.splitlines(), 1)
    self.assertStartsWith(done.stderr, "error: ")
    self.assertIn(message, done.stderr)
    if not args:  # The list of presets is the one this test covers.
      listed = done.stderr.strip().split(": one of ")[1].split(", ")
      self.assertCountEqual(listed, _PRESETS)

  def test_without_gcloud(self):
    done = self._launch("--config=v4-8", path=self.empty_bin)
    self.assertEqual(done.returncode, 1)
    self.assertLen(done.stderr.splitlines(), 1)
    self.assertIn("gcloud is not on PATH", done.stderr)


if __name__ == "__main__":
  absltest.main()
