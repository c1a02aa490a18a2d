"""launch/tpu_vm.py's dry runs: every preset, generation and flag, and errors.

Each dry run runs on launch_fakes' PATH of fakes, and the run it prints is
parsed back with gin, so the launcher cannot drift from the configs or the
run's configurables. A bad argument is one line on stderr, before gcloud.
"""

import re
import shlex

from absl.testing import absltest
from absl.testing import parameterized
import gin

import launch_fakes

_ROOT = launch_fakes.ROOT
_TPU_VM = launch_fakes.TPU_VM
_WRITE_SCOPE = launch_fakes.WRITE_SCOPE
_after = launch_fakes.after

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


def _setup_pin(name):
  match = re.search(rf"\"{name}==([^\"]+)\"", (_ROOT / "setup.py").read_text())
  return match[1]


class LaunchDryRunTest(launch_fakes.LaunchTestCase):

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

  def test_without_gcloud(self):
    done = self._launch("--config=v4-8", path=self.empty_bin)
    self.assertEqual(done.returncode, 1)
    self.assertLen(done.stderr.splitlines(), 1)
    self.assertIn("gcloud is not on PATH", done.stderr)


if __name__ == "__main__":
  absltest.main()
