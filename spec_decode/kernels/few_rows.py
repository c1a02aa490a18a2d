"""x [..., K] times a transposed kernel [N, K] for a few rows, on CPU.

XLA:CPU multiplies 2-16 rows by a weight matrix far below the memory bound
(on a Zen 2 core, 5 rows cost about 2.3 one-row products), so a
(gamma+1)-token verification call costs much more than a decode step.
`few_rows.cc` streams each weight row once for all the rows instead, and
computes 17-64 rows (an encoder's input at batch 1) in register tiles; it is
an XLA FFI custom call, compiled for the host CPU on first use (about 3 s;
`spec_decode/kernels/library.py`).

`product(x, kernel)` is the einsum "...k,nk->...n" to float32 rounding. It
uses the kernel only on CPU, in float32, for at most `MAX_ROWS` rows, outside
a multi-device mesh, and where it compiles; otherwise it is that einsum. Its
gradient is the einsum's, so a model with it trains as one without.

Usage:
  from spec_decode.kernels import few_rows
  y = few_rows.product(x, kernel)    # x [..., K], kernel [N, K] -> [..., N]
"""

import pathlib

import jax
from jax import lax
import jax.numpy as jnp

from spec_decode.kernels import library

_SOURCE = pathlib.Path(__file__).with_name("few_rows.cc")
# What it includes: the worker threads, the vector helpers, the tiles.
_HEADERS = tuple(
    _SOURCE.with_name(name) for name in ("spin_pool.h", "vec8.h", "row_tiles.h")
)
_TARGET = "spec_decode_few_rows_product"
# In the 48.2M demo target on a 2-core Zen 2 CPU the kernel's passes over
# groups of rows still beat XLA at 16 rows (a 16-token call 13.4 ms against
# 17.3; benchmarks/kernel_layouts.py). From TILE_MIN_ROWS rows it computes in
# register tiles (row_tiles.h's kTileMinRows): on a 2-core Zen 3 EPYC, the
# demo target's weight matrices times 17-32 rows took 0.51-0.93 of XLA's time
# and 48-64 rows 0.81-1.03 (benchmarks/row_tiles.py), 96-128 rows 1.01-1.05
# (timed ad hoc; README, "A twenty-third session"). So up to 64 rows: an
# encoder's at batch 1, a verification call's at batch 8.
MAX_ROWS = 64
# Products of this many rows or more are computed in tiles (row_tiles.h's
# kTileMinRows; tests/few_rows_test.py fails where the two differ): a row's
# result is then the same whatever the rows among them, and differs in the
# last bits from what it is among 16 rows or fewer.
TILE_MIN_ROWS = 17


def available():
  """Whether the kernel is compiled and registered; logs why not, once."""
  return library.register(
      _SOURCE, _HEADERS, (), "FewRowsProduct", _TARGET, "few-rows CPU kernel"
  )


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
