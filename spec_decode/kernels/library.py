"""Builds spec_decode's C++ CPU kernels and registers them with XLA.

Each kernel is one C++ source (and the headers it includes), an XLA FFI
handler compiled for the host CPU on first use (`g++ -O3 -march=native`, a
few seconds) and cached under ~/.cache/spec_decode/kernels, or
$SPEC_DECODE_CACHE/kernels, keyed by the sources, the command, jaxlib's
version and the CPU. Where it does not compile (no compiler), `register`
says why once and returns False, and the model uses XLA's ops instead.

Usage:
  if library.register(source, headers, flags, "HandlerSymbol",
                      "target_name", "the few-rows CPU kernel"):
    jax.ffi.ffi_call("target_name", ...)
"""

import ctypes
import functools
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile

from absl import logging
import jax
import jaxlib

_COMPILE_TIMEOUT_S = 300


def _cache_dir():
  root = os.environ.get("SPEC_DECODE_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "spec_decode"
  )
  return pathlib.Path(root) / "kernels"


def _host_cpu():
  """What -march=native depends on: the CPU's model and feature flags."""
  try:
    with open("/proc/cpuinfo") as f:
      lines = [
          l for l in f if l.startswith(("model name", "flags", "Features"))
      ]
  except OSError:
    lines = []
  return platform.machine() + "".join(sorted(set(lines)))


def _compile_command(compiler_path, source, flags, output):
  return [
      compiler_path,
      "-O3",
      "-march=native",
      "-std=c++17",
      "-shared",
      "-fPIC",
      "-pthread",
      "-w",
      *flags,
      f"-I{jax.ffi.include_dir()}",
      str(source),
      "-o",
      str(output),
  ]


def compiler():
  """The C++ compiler kernels are built with ($CXX, g++ or c++), or None."""
  return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def build(source, headers=(), flags=()):
  """The compiled library's path, compiling it if no cached copy matches.

  Args:
    source: the kernel's C++ source, a pathlib.Path.
    headers: the Paths of the headers it includes from beside it.
    flags: the compiler flags it adds to the common ones.

  Raises:
    RuntimeError: with no compiler, or when it fails (its last line).
  """
  compiler_path = compiler()
  if not compiler_path:
    raise RuntimeError("no C++ compiler (set CXX, or install g++)")
  key = hashlib.sha256(
      "\0".join(
          [
              source.read_text(),
              *(header.read_text() for header in headers),
              " ".join(_compile_command(compiler_path, source, flags, "")),
              jaxlib.__version__,
              _host_cpu(),
          ]
      ).encode()
  ).hexdigest()[:16]
  library = _cache_dir() / f"{source.stem}-{key}.so"
  if library.exists():
    return library
  library.parent.mkdir(parents=True, exist_ok=True)
  # Compiled beside its final name, then renamed: concurrent processes (test
  # workers) never load a half-written library.
  with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
    output = pathlib.Path(scratch) / library.name
    result = subprocess.run(
        _compile_command(compiler_path, source, flags, output),
        capture_output=True,
        text=True,
        timeout=_COMPILE_TIMEOUT_S,
        check=False,
    )
    if result.returncode:
      last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
      raise RuntimeError(f"{compiler_path} failed on {source.name}: {last}")
    os.replace(output, library)
  return library


@functools.cache
def register(source, headers, flags, symbol, target, what):
  """Whether `source` is compiled and its handler `symbol` registered as the
  CPU custom call `target`; logs why not, once.

  Args:
    source, headers, flags: as `build`'s (tuples).
    symbol: the handler's exported name (XLA_FFI_DEFINE_HANDLER_SYMBOL).
    target: the custom call's name.
    what: the kernel, for the warning ("the few-rows CPU kernel").
  """
  try:
    library = ctypes.cdll.LoadLibrary(str(build(source, headers, flags)))
    jax.ffi.register_ffi_target(
        target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu"
    )
  except (OSError, RuntimeError, subprocess.SubprocessError) as e:
    logging.warning("%s unavailable, using XLA's ops: %s", what, e)
    return False
  return True
