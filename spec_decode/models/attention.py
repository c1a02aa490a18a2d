"""T5's attention (no 1/sqrt(d) scaling) and its projections.

`dot_product_attention` reads the cache's keys [B, H, D, S] and values
[B, H, S, D] in place and normalizes its softmax after the values' product;
with `per_query` it attends a call's few queries one at a time, each as a
call with it alone (`T5Config.per_query_attention`), and with `kernel` it
attends them in one CPU custom call, each again as alone
(`T5Config.attention_kernel`, `spec_decode/kernels/few_queries.py`).
`MultiHeadAttention` holds the query, key, value and output projections with
t5x's parameter names and logical axes; the caller supplies keys, values,
biases and masks.
"""

import functools
from typing import Any

from flax import linen as nn
import jax
from jax import lax
import jax.numpy as jnp

from spec_decode.kernels import few_queries
from spec_decode.models import layers

DType = Any

# Added to masked attention logits: large enough to zero a softmax weight in
# float32, finite so that a row with no valid key gives no NaN.
MASK_VALUE = -1e10

# The most queries `per_query` attention takes one at a time; more (a
# decoder's teacher-forced training pass) go to one batched dot.
PER_QUERY_MAX_QUERIES = 16


def _query_slice(x, t):
  """Query t's slice of an array broadcastable to [B, H, T, S] (or None)."""
  if x is None or x.shape[2] == 1:
    return x
  return x[:, :, t : t + 1]


def _per_query_attention(query, key, value, bias, mask, dtype):
  """`dot_product_attention`, one query at a time: [B, T, H, D]."""
  outputs = [
      dot_product_attention(
          query[:, t : t + 1],
          key,
          value,
          _query_slice(bias, t),
          _query_slice(mask, t),
          dtype,
      )
      for t in range(query.shape[1])
  ]
  return jnp.concatenate(outputs, axis=1)  # T x [B, 1, H, D] -> [B, T, H, D]


def _xla_attention(query, key, value, bias, mask):
  """`dot_product_attention` in float32 as XLA's ops: the kernel's gradient,
  and what it lowers to off CPU."""
  return dot_product_attention(query, key, value, bias, mask, jnp.float32)


@jax.custom_vjp
def _kernel_attention(query, key, value, bias, mask):
  return lax.platform_dependent(
      query,
      key,
      value,
      bias,
      mask,
      cpu=few_queries.attention,
      default=_xla_attention,
  )


def _kernel_forward(query, key, value, bias, mask):
  args = (query, key, value, bias, mask)
  return _kernel_attention(*args), args


def _kernel_backward(args, grad):
  return jax.vjp(_xla_attention, *args)[1](grad)


_kernel_attention.defvjp(_kernel_forward, _kernel_backward)


def dot_product_attention(
    query, key, value, bias, mask, dtype, per_query=False, kernel=False
):
  """T5 attention: no 1/sqrt(d) scaling (t5x folds it into the query init).

  Keys and values come in the cache's layout: keys [B, H, D, S] and values
  [B, H, S, D], each the right-hand operand of its dot as a matmul reads it
  (batch dims first, then the contracted dim for keys and the kept dim for
  values). XLA then reads the cache in place, with no transpose or copy of
  it, at any batch and any number of new tokens.

  Args:
    query: [B, T, H, D].
    key: [B, H, D, S].
    value: [B, H, S, D].
    bias: broadcastable to [B, H, T, S], or None.
    mask: bool broadcastable to [B, H, T, S]; False means masked out.
    dtype: the dtype of the returned values.
    per_query: attend one query at a time when 1 < T <= PER_QUERY_MAX_QUERIES
      (`T5Config.per_query_attention`): each query's outputs are then those
      of a call with that query alone.
    kernel: in float32, for T <= `few_queries.MAX_QUERIES`, attend in the CPU
      kernel (`T5Config.attention_kernel`), each query again as alone; XLA's
      ops on other platforms, and where it does not compile.

  Returns:
    [B, T, H, D] in `dtype`.
  """
  if kernel and few_queries.applies(query, key, value):
    return _kernel_attention(query, key, value, bias, mask).astype(dtype)
  if per_query and 1 < query.shape[1] <= PER_QUERY_MAX_QUERIES:
    return _per_query_attention(query, key, value, bias, mask, dtype)
  logits = jnp.einsum(
      "bthd,bhds->bhts", query, key, preferred_element_type=jnp.float32
  )
  if bias is not None:
    logits = logits + bias
  logits = jnp.where(mask, logits, MASK_VALUE)
  # The softmax, normalized after its product with the values: the
  # exponentials go to the dot unnormalized (in `dtype`), and each
  # [B, T, H, D] output, accumulated in float32, is divided by its row's
  # float32 sum. The [B, H, T, S] float32 logits are then read once fewer
  # than by `jax.nn.softmax` before the dot (a TPU v5p compile of T5 1.1
  # XXL's 8-token call at batch 32: 21.10 -> 20.28 GB off chip, README: What
  # HBM must move).
  unnormalized = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
  # [B, H, T] -> [B, T, H, 1]
  total = jnp.transpose(jnp.sum(unnormalized, axis=-1), (0, 2, 1))[..., None]
  out = jnp.einsum(
      "bhts,bhsd->bthd",
      unnormalized.astype(dtype),
      value,
      preferred_element_type=jnp.float32,
  )
  return (out / total).astype(dtype)


class MultiHeadAttention(nn.Module):
  """Projections and attention; the caller supplies keys/values and masks."""

  num_heads: int
  head_dim: int
  emb_dim: int
  dtype: DType = jnp.float32
  transposed_kernels: bool = False
  few_rows_kernel: bool = False
  per_query: bool = False
  kernel: bool = False

  def setup(self):
    joined = self.num_heads * self.head_dim
    # t5x folds the attention's 1/sqrt(head_dim) into the query's init.
    query_init = nn.initializers.variance_scaling(
        1.0 / self.head_dim, "fan_in", "normal"
    )
    dense = functools.partial(
        layers.Dense,
        dtype=self.dtype,
        transposed=self.transposed_kernels,
        few_rows=self.few_rows_kernel,
    )
    self.query = dense(joined, ("embed", "joined_kv"), kernel_init=query_init)
    self.key = dense(joined, ("embed", "joined_kv"))
    self.value = dense(joined, ("embed", "joined_kv"))
    self.out = dense(self.emb_dim, ("joined_kv", "embed"))

  def _heads(self, x):
    # [B, T, H * D] -> [B, T, H, D]
    return x.reshape(x.shape[:-1] + (self.num_heads, self.head_dim))

  def project_query(self, x):
    """[B, T, E] -> [B, T, H, D]."""
    return self._heads(self.query(x))

  def project_key_value(self, x):
    """[B, S, E] -> keys [B, H, D, S] and values [B, H, S, D]."""
    # [B, S, H, D] -> [B, H, D, S] and [B, H, S, D]
    keys = jnp.transpose(self._heads(self.key(x)), (0, 2, 3, 1))
    values = jnp.transpose(self._heads(self.value(x)), (0, 2, 1, 3))
    return keys, values

  def attend(self, query, key, value, bias, mask):
    """[B, T, H, D] queries -> [B, T, E], over keys [B, H, D, S], values
    [B, H, S, D]."""
    x = dot_product_attention(
        query, key, value, bias, mask, self.dtype, self.per_query, self.kernel
    )
    # [B, T, H, D] -> [B, T, H * D]
    x = x.reshape(x.shape[:-2] + (self.num_heads * self.head_dim,))
    return self.out(x)
