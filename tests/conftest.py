"""Test set-up: 8 simulated CPU devices, and one compilation cache.

XLA reads the device flag once, when JAX's CPU backend starts, so it is set
here, before any test module imports JAX. Tests that do not shard run on
device 0.

Compilation dominates this suite: many tests, and the CLIs and notebook
kernels they start as subprocesses, compile the same programs of the same
tiny and demo models. They share JAX's persistent compilation cache, in a
directory made once per pytest run (the pytest-xdist workers inherit it from
the process that starts them) and removed when that process exits. A cache
entry is keyed by the program, the compile options and the devices, so it
changes no result.
"""

import atexit
import gc
import os
import shutil
import tempfile

import pytest

_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"
if _DEVICES_FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(
      filter(None, [os.environ.get("XLA_FLAGS"), _DEVICES_FLAG])
  )

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _CACHE_DIR = tempfile.mkdtemp(prefix="spec_decode_tests_jax_cache_")
  atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE_DIR
  # Every program, not only those that took a second or more to compile.
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"

# After the flags: the CPU backend starts at the first computation.
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
