"""A decode call's attention, all its queries and heads in one CPU call.

XLA:CPU runs a decode call's attention as about eight small ops per query and
layer, each a thunk of its own; `few_queries.cc` computes an attention's
rows, queries and heads in one XLA FFI custom call, compiled for the host CPU
on first use (`spec_decode/kernels/library.py`). Each query's output is
bit-identical whether it comes alone or among others, so a verification call
scores its tokens exactly as that many decode steps would.

`attention` is `models/attention.py`'s T5 attention (no 1/sqrt(d) scaling,
masked logits MASK_VALUE) to float32 rounding, in the same layouts. It has no
gradient of its own: `models/attention.py` gives it the XLA version's.

Usage:
  from spec_decode.kernels import few_queries
  if few_queries.applies(query, key, value):
    out = few_queries.attention(query, key, value, bias, mask)
"""

import pathlib

import jax
import jax.numpy as jnp

from spec_decode.kernels import library

_SOURCE = pathlib.Path(__file__).with_name("few_queries.cc")
_TARGET = "spec_decode_few_queries_attention"
# Every multiply and add as written: GCC's default contracts some of them into
# fused multiply-adds and not others, differently in each template instance,
# so the keys of a full block and of the last one were summed differently.
_FLAGS = ("-ffp-contract=off",)
# The most queries it takes: a decode call's (a verification call's gamma + 1
# tokens); a decoder's teacher-forced training pass stays in XLA.
MAX_QUERIES = 16


def available():
  """Whether the kernel is compiled and registered; logs why not, once."""
  return library.register(
      _SOURCE,
      (),
      _FLAGS,
      "FewQueriesAttention",
      _TARGET,
      "few-queries CPU attention kernel",
  )


def applies(query, key, value):
  """Whether `attention` takes these operands (else use XLA's ops): float32,
  at most MAX_QUERIES queries, outside a multi-device mesh, where the kernel
  compiles. It runs on CPU only: elsewhere, lower XLA's ops in its place
  (`lax.platform_dependent`)."""
  return (
      query.dtype == key.dtype == value.dtype == jnp.float32
      and query.ndim == key.ndim == value.ndim == 4
      and query.shape[1] <= MAX_QUERIES
      and jax.sharding.get_abstract_mesh().size <= 1
      and available()
  )


def _rank4(x, num_keys):
  """x broadcastable to [B, H, T, S], as a rank-4 array whose last dim is S."""
  x = jnp.reshape(x, (1,) * (4 - x.ndim) + x.shape)  # [.., .., .., S or 1]
  return jnp.broadcast_to(x, x.shape[:3] + (num_keys,))


def attention(query, key, value, bias, mask):
  """T5 attention of a few queries, float32.

  Args:
    query, key, value, bias, mask: as `models.attention.dot_product_attention`
      takes them (bias may be None), float32.

  Returns:
    [B, T, H, D] float32.

  Raises:
    RuntimeError: where the kernel does not compile (`available`).
  """
  if not available():
    raise RuntimeError("the few-queries CPU attention kernel did not compile")
  num_keys = key.shape[-1]
  has_bias = bias is not None
  if not has_bias:
    # Read by no one (has_bias False), but checked as a bias would be.
    bias = jnp.zeros((1, 1, 1, num_keys), jnp.float32)
  out = jax.ShapeDtypeStruct(query.shape, jnp.float32)
  return jax.ffi.ffi_call(_TARGET, out, vmap_method="sequential")(
      query,
      key,
      value,
      _rank4(bias.astype(jnp.float32), num_keys),
      _rank4(mask.astype(jnp.bool_), num_keys),
      has_bias=has_bias,
  )
