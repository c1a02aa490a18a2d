"""x [..., K] times a transposed kernel [N, K] for a few rows, on CPU.

XLA:CPU multiplies 2-16 rows by a weight matrix far below the memory bound
(on a Zen 2 core, 5 rows cost about 2.3 one-row products), so a
(gamma+1)-token verification call costs much more than a decode step.
`few_rows.cc` streams each weight row once for all the rows instead; it is an
XLA FFI custom call, compiled for the host CPU on first use (`g++ -O3
-march=native`, about 3 s) and cached under ~/.cache/spec_decode, or
$SPEC_DECODE_CACHE.

`product(x, kernel)` is the einsum "...k,nk->...n" to float32 rounding. It
uses the kernel only on CPU, in float32, for at most `MAX_ROWS` rows, outside
a multi-device mesh, and where it compiles; otherwise it is that einsum. Its
gradient is the einsum's, so a model with it trains as one without.

Usage:
  from spec_decode.kernels import few_rows
  y = few_rows.product(x, kernel)    # x [..., K], kernel [N, K] -> [..., N]
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
from jax import lax
import jax.numpy as jnp
import jaxlib

_SOURCE = pathlib.Path(__file__).with_name("few_rows.cc")
# The worker threads it includes.
_HEADER = _SOURCE.with_name("spin_pool.h")
_TARGET = "spec_decode_few_rows_product"
# In the 48.2M demo target on a 2-core Zen 2 CPU the kernel still beat XLA at
# 16 rows (a 16-token call 13.4 ms against 17.3; benchmarks/kernel_layouts.py);
# past about 24 the products turn compute-bound and XLA's kernels catch up.
MAX_ROWS = 16
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


def _compile_command(compiler, output):
  return [
      compiler,
      "-O3",
      "-march=native",
      "-std=c++17",
      "-shared",
      "-fPIC",
      "-pthread",
      "-w",
      f"-I{jax.ffi.include_dir()}",
      str(_SOURCE),
      "-o",
      str(output),
  ]


def compiler():
  """The C++ compiler the kernel is built with ($CXX, g++ or c++), or None."""
  return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _build():
  """The compiled library's path, compiling it if no cached copy matches."""
  compiler_path = compiler()
  if not compiler_path:
    raise RuntimeError("no C++ compiler (set CXX, or install g++)")
  key = hashlib.sha256(
      "\0".join(
          [
              _SOURCE.read_text(),
              _HEADER.read_text(),
              " ".join(_compile_command(compiler_path, "")),
              jaxlib.__version__,
              _host_cpu(),
          ]
      ).encode()
  ).hexdigest()[:16]
  library = _cache_dir() / f"few_rows-{key}.so"
  if library.exists():
    return library
  library.parent.mkdir(parents=True, exist_ok=True)
  # Compiled beside its final name, then renamed: concurrent processes (test
  # workers) never load a half-written library.
  with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
    output = pathlib.Path(scratch) / library.name
    result = subprocess.run(
        _compile_command(compiler_path, output),
        capture_output=True,
        text=True,
        timeout=_COMPILE_TIMEOUT_S,
        check=False,
    )
    if result.returncode:
      last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
      raise RuntimeError(f"{compiler_path} failed on {_SOURCE.name}: {last}")
    os.replace(output, library)
  return library


@functools.cache
def available():
  """Whether the kernel is compiled and registered; logs why not, once."""
  try:
    library = ctypes.cdll.LoadLibrary(str(_build()))
    jax.ffi.register_ffi_target(
        _TARGET, jax.ffi.pycapsule(library.FewRowsProduct), platform="cpu"
    )
  except (OSError, RuntimeError, subprocess.SubprocessError) as e:
    logging.warning("few-rows CPU kernel unavailable, using XLA's dot: %s", e)
    return False
  return True


def _einsum(x, kernel):
  return jnp.einsum("...k,nk->...n", x, kernel)


def _ffi_product(x, kernel):
  out = jax.ShapeDtypeStruct(x.shape[:-1] + kernel.shape[:1], jnp.float32)
  return jax.ffi.ffi_call(_TARGET, out, vmap_method="sequential")(x, kernel)


@jax.custom_vjp
def _kernel_product(x, kernel):
  # The custom call on CPU; any other platform lowers the einsum.
  return lax.platform_dependent(x, kernel, cpu=_ffi_product, default=_einsum)


def _forward(x, kernel):
  return _kernel_product(x, kernel), (x, kernel)


def _backward(residuals, grad):
  x, kernel = residuals
  return (
      jnp.einsum("...n,nk->...k", grad, kernel),
      jnp.einsum("...n,...k->nk", grad, x),
  )


_kernel_product.defvjp(_forward, _backward)


def applies(x, kernel):
  """Whether `product` would use the kernel for these operands."""
  rows = x.size // max(x.shape[-1], 1)
  return (
      x.dtype == kernel.dtype == jnp.float32
      and kernel.ndim == 2
      and 0 < rows <= MAX_ROWS
      and jax.sharding.get_abstract_mesh().size <= 1
      and available()
  )


def product(x, kernel):
  """float32 x [..., K] times kernel [N, K] -> [..., N]."""
  if applies(x, kernel):
    return _kernel_product(x, kernel)
  return _einsum(x, kernel)
