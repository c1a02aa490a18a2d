"""The XLA flags the test suite runs under (set by conftest.py).

SIMULATED_DEVICES gives the CPU backend 8 devices, for the sharding tests.
FAST_COMPILE compiles the same programs in about a third less time:
XLA:CPU's elemental IR emitters instead of its MLIR fusion emitters, and
LLVM at -O1 instead of -O2. Neither allows fast math; xla_flags_test.py
checks that programs compiled with and without them compute the same bits.
"""

SIMULATED_DEVICES = "--xla_force_host_platform_device_count=8"
FAST_COMPILE = (
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_backend_optimization_level=1",
)


def name(flag):
  """'--xla_name=value' -> '--xla_name'."""
  return flag.split("=")[0]
