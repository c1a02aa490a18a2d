"""launch/tpu_vm.py: the dry runs of every preset, generation and step.

The dry runs run with a PATH whose only commands are fakes that leave a mark,
so a dry run that called gcloud (or anything else) fails the test. The
`python -m spec_decode.run` command each one prints is parsed back with
shlex, and its gin files and bindings are parsed with gin as run.py would,
so the launcher cannot drift from the configs or the run's configurables.
The shell the launcher writes (the wait for a queued resource, the delete
that finds out what to delete, apt's wait for its lock) is run against a
scripted fake gcloud or apt-get.
"""

import os
import pathlib
import re
import shlex
import shutil
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
sys.path.insert(0, str(_SCRIPT.parent))
import commands as launch_commands  # pylint: disable=g-import-not-at-top,wrong-import-position

# Cloud TPU facts, kept apart from the launcher's own table on purpose:
# the software versions of https://cloud.google.com/tpu/docs/runtimes and a
# zone of https://cloud.google.com/tpu/docs/regions-zones for each.
# Preset: (accelerator type, TPU software version, zone, hosts, chips).
_PRESETS = {
    "v4-8": ("v4-8", "tpu-ubuntu2204-base", "us-central2-b", 1, 4),
    "v5e-8": ("v5litepod-8", "v2-alpha-tpuv5-lite", "us-central1-a", 1, 8),
    "v4-32": ("v4-32", "tpu-ubuntu2204-base", "us-central2-b", 4, 16),
}
# Accelerator type: (TPU software version, default zone, hosts, chips).
_GENERATIONS = {
    "v4-16": ("tpu-ubuntu2204-base", "us-central2-b", 2, 8),
    "v5p-8": ("v2-alpha-tpuv5", "us-central1-a", 1, 4),
    "v5litepod-16": ("v2-alpha-tpuv5-lite", "us-central1-a", 4, 16),
    "v6e-8": ("v2-alpha-tpuv6e", "us-central1-b", 1, 8),
}
# A zone each generation is not offered in.
_WRONG_ZONES = {
    "v4-8": "us-central1-a",
    "v5p-8": "us-central2-b",
    "v5litepod-8": "us-east1-d",
    "v6e-8": "us-central2-b",
}
_TPU_VM = ["gcloud", "compute", "tpus", "tpu-vm"]
_QUEUED = ["gcloud", "compute", "tpus", "queued-resources"]
_WRITE_SCOPE = "--scopes=https://www.googleapis.com/auth/cloud-platform"
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
    accelerator_type, version, zone, hosts, chips = _PRESETS[config]
    commands = self._dry_run(f"--config={config}")
    for argv in commands:
      self.assertIn(argv[0], ("gcloud", "bash", "mkdir"))
      if argv[0] == "gcloud":
        self.assertEqual(_after(argv, "--zone="), [zone])
    name = f"spec-decode-{config}"

    (create,) = [a for a in commands if a[:5] == _TPU_VM + ["create"]]
    self.assertEqual(create[5], name)
    self.assertIn(f"--accelerator-type={accelerator_type}", create)
    self.assertIn(f"--version={version}", create)
    self.assertEmpty(_after(create, "--scopes="))  # Nothing to write to GCS.

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
    self.assertIn(_WRITE_SCOPE, commands[0])  # gs:// output: write scopes.
    self.assertEqual(commands[-1][:6], _TPU_VM + ["delete", "my-tpu"])
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
      (["--config=v4-8", "--steps=queue,create"], "both queue and create"),
      (
          [
              "--config=v4-32",
              "--accelerator_type=v6e-16",
              "--zone=us-central2-b",
          ],
          "zone 'us-central2-b' does not offer v6e",
      ),
      (["--config=v4-8", "--accelerator_type=v5e-8"], "unknown accelerator"),
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

  @parameterized.parameters(*_GENERATIONS)
  def test_generation(self, accelerator_type):
    version, zone, hosts, chips = _GENERATIONS[accelerator_type]
    for config in _PRESETS:  # Any generation with any preset.
      commands = self._dry_run(
          f"--config={config}", f"--accelerator_type={accelerator_type}"
      )
      for argv in commands:
        if argv[0] == "gcloud":
          self.assertEqual(_after(argv, "--zone="), [zone])
      (create,) = [a for a in commands if a[:5] == _TPU_VM + ["create"]]
      self.assertIn(f"--accelerator-type={accelerator_type}", create)
      self.assertEqual(_after(create, "--version="), [version])
      self._parse_run(commands)
      self.assertEqual(gin.query_parameter("make_mesh.model_parallel"), chips)
      self.assertEqual(
          gin.query_parameter("initialize_distributed.enabled"), hosts > 1
      )
      gin.clear_config()

  @parameterized.parameters(*_WRONG_ZONES.items())
  def test_zone_refused_before_gcloud(self, accelerator_type, zone):
    # Not a dry run: gcloud is on PATH, and must not be called.
    for steps in ("create,install,run,fetch", "queue,install", "delete"):
      done = self._launch(
          "--config=v4-8",
          f"--accelerator_type={accelerator_type}",
          f"--zone={zone}",
          f"--steps={steps}",
      )
      self.assertEqual(done.returncode, 1)
      self.assertLen(done.stderr.splitlines(), 1)
      self.assertIn(f"zone {zone!r} does not offer", done.stderr)

  def test_queue(self):
    commands = self._dry_run(
        "--config=v5e-8",
        "--steps=queue,install,run,fetch",
        "--delete_after",
        "--spot",
        "--output_dir=gs://my-bucket/runs",
    )
    name = "spec-decode-v5e-8"
    queue, wait = commands[:2]
    self.assertEqual(queue[:6], _QUEUED + ["create", name])
    self.assertEqual(_after(queue, "--node-id="), [name])
    self.assertEqual(
        _after(queue, "--runtime-version="), ["v2-alpha-tpuv5-lite"]
    )
    self.assertEmpty(_after(queue, "--version="))
    self.assertEqual(_after(queue, "--accelerator-type="), ["v5litepod-8"])
    self.assertEqual(_after(queue, "--zone="), ["us-central1-a"])
    self.assertIn("--spot", queue)
    self.assertIn(_WRITE_SCOPE, queue)
    self.assertEqual(wait[:2], ["bash", "-c"])
    self.assertFalse([a for a in commands if a[:5] == _TPU_VM + ["create"]])
    # The later steps find the node under the same name.
    self.assertEqual(self._parse_run(commands)[5], name)
    # Cleaned up: the queued resource, and with --force its node.
    self.assertEqual(
        commands[-1],
        _QUEUED
        + ["delete", name, "--zone=us-central1-a", "--force", "--quiet"],
    )

  def _scripted(self, gcloud_script):
    """A PATH with bash and a few tools, a no-op sleep, a scripted gcloud."""
    bin_dir = pathlib.Path(tempfile.mkdtemp(dir=self.tmp))
    calls = bin_dir / "calls"
    scripts = {
        "gcloud": f'echo "gcloud $*" >> "{calls}"\n{gcloud_script}',
        "sleep": f'echo "sleep $*" >> "{calls}"',
    }
    for name, body in scripts.items():
      path = bin_dir / name
      path.write_text(f"#!/bin/bash\n{body}\n")
      path.chmod(path.stat().st_mode | stat.S_IXUSR)
    for tool in ("bash", "dirname", "env", "grep", "sed"):
      (bin_dir / tool).symlink_to(shutil.which(tool))
    return bin_dir, calls

  def _run_shell(self, argv, bin_dir):
    return subprocess.run(
        argv,
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        check=False,
        cwd=self.tmp,
    )

  @parameterized.parameters(
      (["WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"], 0),
      (["ACCEPTED", "WAITING_FOR_RESOURCES", "FAILED"], 1),
      (["PROVISIONING", "SUSPENDED"], 1),
  )
  def test_queue_wait(self, states, returncode):
    (wait,) = [
        a
        for a in self._dry_run("--config=v4-8", "--steps=queue")
        if a[:2] == ["bash", "-c"]
    ]
    # The n-th describe prints the n-th state.
    states_file = self.tmp / "states"
    states_file.write_text("\n".join(states) + "\n")
    bin_dir, calls = self._scripted(
        f'n=$(grep -c describe "$(dirname "$0")/calls"); '
        f'sed -n "${{n}}p" "{states_file}"'
    )
    done = self._run_shell(wait, bin_dir)
    self.assertEqual(done.returncode, returncode, done.stderr)
    lines = calls.read_text().splitlines()
    describes = [l for l in lines if l.startswith("gcloud")]
    self.assertLen(describes, len(states))
    self.assertEqual(
        shlex.split(describes[0]),
        _QUEUED
        + [
            "describe",
            "spec-decode-v4-8",
            "--zone=us-central2-b",
            "--format=value(state.state)",
        ],
    )
    # A pause between two looks, none after the last.
    self.assertLen([l for l in lines if l.startswith("sleep")], len(states) - 1)

  @parameterized.parameters((0, "queued-resources"), (1, "tpu-vm"))
  def test_delete_finds_what_to_delete(self, describe_status, kind):
    (delete,) = self._dry_run("--config=v4-8", "--steps=delete")
    bin_dir, calls = self._scripted(
        f'[ "$4" = describe ] && exit {describe_status}; exit 0'
    )
    done = self._run_shell(delete, bin_dir)
    self.assertEqual(done.returncode, 0, done.stderr)
    _, deleted = [shlex.split(l) for l in calls.read_text().splitlines()]
    self.assertEqual(
        deleted[:6],
        ["gcloud", "compute", "tpus", kind, "delete", "spec-decode-v4-8"],
    )
    self.assertEqual("--force" in deleted, kind == "queued-resources")

  @parameterized.parameters(
      # A failed queued-resources create may be another's name: no delete.
      ('[ "$4" = create ] && exit 1; exit 0', ["create"]),
      # A queued resource that FAILED is deleted, with its node.
      (
          '[ "$4" = describe ] && echo FAILED; exit 0',
          ["create", "describe", "delete"],
      ),
  )
  def test_queue_failure_with_delete_after(self, gcloud_script, verbs):
    bin_dir, calls = self._scripted(gcloud_script)
    done = self._launch(
        "--config=v4-8", "--steps=queue", "--delete_after", path=bin_dir
    )
    self.assertEqual(done.returncode, 1)
    self.assertEqual(
        done.stderr.splitlines()[-1].split(" failed")[0], "error: queue"
    )
    called = [shlex.split(l) for l in calls.read_text().splitlines()]
    self.assertEqual([c[3] for c in called], ["queued-resources"] * len(verbs))
    self.assertEqual([c[4] for c in called], verbs)
    if "delete" in verbs:
      self.assertIn("--force", called[-1])

  @parameterized.parameters((2, 0), (launch_commands.APT_UPDATE_TRIES, 1))
  def test_apt_waits_for_its_lock(self, update_failures, returncode):
    # The install command's apt part, on a VM whose apt lists lock is held
    # for the first `update_failures` tries; dpkg's lock is apt-get's to wait
    # for (its DPkg::Lock::Timeout option).
    (install,) = [
        c
        for a in self._dry_run("--config=v4-8", "--steps=install")
        for c in _after(a, "--command=")
    ]
    apt_part = launch_commands.apt_python("python3.11")
    self.assertTrue(install.startswith(apt_part + " && "))
    bin_dir, calls = self._scripted("exit 1")
    fakes = {
        "python3.11": "exit 1",  # No ensurepip: Python 3.11 is missing.
        "sudo": f'echo "sudo $*" >> "{calls}"; exec env "$@"',
        "apt-get": (
            f'[ "$3" = update ] && [ $(grep -c " update" "{calls}") -le '
            f"{update_failures} ] && echo 'E: Could not get lock "
            "/var/lib/apt/lists/lock' >&2 && exit 100; exit 0"
        ),
    }
    for name, body in fakes.items():
      path = bin_dir / name
      path.write_text(f"#!/bin/bash\n{body}\n")
      path.chmod(path.stat().st_mode | stat.S_IXUSR)
    done = self._run_shell(["bash", "-c", apt_part], bin_dir)
    self.assertEqual(done.returncode, returncode, done.stderr)
    lines = calls.read_text().splitlines()
    updates = [l for l in lines if l.endswith(" update -qq")]
    installs = [l for l in lines if " install " in l]
    timeout = f"-o DPkg::Lock::Timeout={launch_commands.APT_LOCK_TIMEOUT_S}"
    for line in updates + installs:
      self.assertIn(f"apt-get {timeout} ", line)
    if returncode == 0:
      self.assertLen(updates, update_failures + 1)
      self.assertEqual(
          installs,
          [
              f"sudo DEBIAN_FRONTEND=noninteractive apt-get {timeout} "
              "install -y -qq python3.11 python3.11-venv"
          ],
      )
    else:
      self.assertLen(updates, launch_commands.APT_UPDATE_TRIES)
      self.assertEmpty(installs)
    self.assertLen(
        [l for l in lines if l.startswith("sleep")], len(updates) - 1
    )

  def test_without_gcloud(self):
    done = self._launch("--config=v4-8", path=self.empty_bin)
    self.assertEqual(done.returncode, 1)
    self.assertLen(done.stderr.splitlines(), 1)
    self.assertIn("gcloud is not on PATH", done.stderr)


if __name__ == "__main__":
  absltest.main()
