"""spec_decode.machine: what results.json records of where it ran."""

import pathlib
import tempfile

from absl.testing import absltest
import jax

from spec_decode import machine

# describe()'s dict on a 2-core CPU host.
CPU_MACHINE = dict(
    platform="cpu",
    device_kind="cpu",
    num_devices=1,
    cpu="AMD EPYC",
    cpus=2,
    last_level_cache="L3 16384K",
)


def _write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)


class MachineTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = pathlib.Path(tempfile.mkdtemp())

  def test_cpu_model_reads_the_first_model_name(self):
    cpuinfo = self.tmp / "cpuinfo"
    _write(
        cpuinfo,
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel\t\t: 49\n"
        "model name\t: AMD EPYC 7B12\n\nprocessor\t: 1\n"
        "model name\t: AMD EPYC 7B12\n",
    )
    self.assertEqual(machine.cpu_model(cpuinfo), "AMD EPYC 7B12")

  def test_cpu_family_reads_family_and_model(self):
    cpuinfo = self.tmp / "cpuinfo"
    _write(
        cpuinfo,
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n"
        "model\t\t: 2\nmodel name\t: AMD EPYC\n",
    )
    self.assertEqual(machine.cpu_family(cpuinfo), "family 26 model 2")
    _write(cpuinfo, "model name\t: AMD EPYC\n")
    self.assertIsNone(machine.cpu_family(cpuinfo))
    self.assertIsNone(machine.cpu_family(self.tmp / "missing"))

  def test_cpu_model_without_cpuinfo_falls_back(self):
    model = machine.cpu_model(self.tmp / "missing")
    self.assertIsInstance(model, str)
    self.assertNotEmpty(model)

  def test_last_level_cache_is_the_highest_level(self):
    caches = self.tmp / "cache"
    for index, level, size in (
        (0, 1, "32K"),
        (1, 1, "32K"),
        (2, 2, "512K"),
        (3, 3, "16384K"),
    ):
      _write(caches / f"index{index}" / "level", f"{level}\n")
      _write(caches / f"index{index}" / "size", f"{size}\n")
    self.assertEqual(machine.last_level_cache(caches), (3, "16384K"))

  def test_last_level_cache_unknown(self):
    self.assertIsNone(machine.last_level_cache(self.tmp / "missing"))
    caches = self.tmp / "broken"
    _write(caches / "index0" / "level", "not a number\n")
    _write(caches / "index0" / "size", "32K\n")
    self.assertIsNone(machine.last_level_cache(caches))

  def test_describe_names_this_process_devices(self):
    described = machine.describe()
    self.assertEqual(described["platform"], jax.devices()[0].platform)
    self.assertEqual(described["num_devices"], jax.device_count())
    self.assertEqual(described["jax"], jax.__version__)
    self.assertGreaterEqual(described["cpus"], 1)

  def test_summary(self):
    cpu = CPU_MACHINE
    self.assertEqual(machine.summary(cpu), "cpu: AMD EPYC, 2 CPUs, L3 16384K")
    self.assertEqual(
        machine.summary(dict(cpu, cpu_family="family 26 model 2")),
        "cpu: AMD EPYC (family 26 model 2), 2 CPUs, L3 16384K",
    )
    gpu = dict(cpu, platform="gpu", device_kind="NVIDIA H200", num_devices=1)
    gpu["last_level_cache"] = None
    self.assertEqual(
        machine.summary(gpu), "1 x NVIDIA H200 (gpu); host AMD EPYC, 2 CPUs"
    )


if __name__ == "__main__":
  absltest.main()
