"""Test set-up: 8 simulated CPU devices, one scratch directory, one cache.

XLA reads its flags once, when JAX's CPU backend starts, so they are set
here, before any test module imports JAX. Tests that do not shard run on
device 0. Two more make XLA:CPU compile faster (`xla_flags.FAST_COMPILE`);
a flag already in XLA_FLAGS keeps its value there.

Every temporary file of a pytest run lands in one scratch directory, made
when the run starts and removed when it exits: the tests' own, and those of
the CLIs, notebook kernels, pip builds and TensorFlow that the tests start
(they inherit TMPDIR). Runs used to leave them in /tmp: 12 GB after one
session's runs of the suite.

Compilation dominates this suite: many tests, and the CLIs and notebook
kernels they start as subprocesses, compile the same programs of the same
tiny and demo models. They share JAX's persistent compilation cache, in the
scratch directory. A cache entry is keyed by the program, the compile
options and the devices, so it changes no result.

The pytest-xdist workers inherit both from the process that starts them,
which removes the directory when it exits, after them.
"""

import atexit
import gc
import os
import shutil
import tempfile

import pytest

import xla_flags

for _flag in (xla_flags.SIMULATED_DEVICES, *xla_flags.FAST_COMPILE):
  if xla_flags.name(_flag) not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(
        filter(None, [os.environ.get("XLA_FLAGS"), _flag])
    )

# Set in the process that starts the run; its workers inherit it.
_SCRATCH_VARIABLE = "SPEC_DECODE_TESTS_SCRATCH"
if _SCRATCH_VARIABLE not in os.environ:
  _scratch = tempfile.mkdtemp(prefix="spec_decode_tests_")
  atexit.register(shutil.rmtree, _scratch, ignore_errors=True)
  os.environ[_SCRATCH_VARIABLE] = _scratch
  os.environ["TMPDIR"] = os.path.join(_scratch, "tmp")
  os.mkdir(os.environ["TMPDIR"])
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(_scratch, "jax")
    # Every program, not only those that took a second or more to compile.
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
# tempfile may have chosen its directory before this module ran.
tempfile.tempdir = os.environ["TMPDIR"]

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
