"""Test set-up: 8 simulated CPU devices, for the sharding tests.

XLA reads the flag once, when JAX's CPU backend starts, so it is set here,
before any test module imports JAX. Tests that do not shard run on device 0.
"""

import gc
import os

import pytest

_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"
if _DEVICES_FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(
      filter(None, [os.environ.get("XLA_FLAGS"), _DEVICES_FLAG])
  )

# After the flag: the CPU backend starts at the first computation.
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
  """Drops each test module's compiled programs when the module ends.

  The suite runs in one process. Without this, every program any module
  compiled stays loaded, and late in the suite XLA:CPU crashed while
  compiling (SIGSEGV/SIGABRT in backend_compile), in tests that pass alone.
  """
  yield
  jax.clear_caches()
  gc.collect()
