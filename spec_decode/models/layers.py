"""T5 building blocks in Flax Linen, with t5x's parameter names and axes.

Every parameter carries logical axis names from t5x's vocabulary (`vocab`,
`embed`, `mlp`, `heads`, `kv`, `joined_kv`, `relpos_buckets`), so that one table
of rules in the partitioning code can shard any model. Kernels are stored as t5x
stores them: 2-D, e.g. an attention query kernel is [embed, heads * head_dim];
with `T5Config.transposed_kernels` they are [heads * head_dim, embed] instead,
their axis names reversed (`Dense.transposed`).

References:
  Raffel et al., 2020, "Exploring the Limits of Transfer Learning with a Unified
  Text-to-Text Transformer" (T5), and the T5 1.1 recipe (gated GELU, untied
  logits) of Shazeer, 2020, "GLU Variants Improve Transformer".
"""

from collections.abc import Sequence
import functools
from typing import Any

from flax import linen as nn
from jax import lax
import jax.numpy as jnp
import numpy as np

from spec_decode.kernels import few_rows as few_rows_kernel

DType = Any

# RMS norm epsilon of T5 (and t5x's LayerNorm).
RMS_NORM_EPSILON = 1e-6


def _partitioned(init, names):
  return nn.with_logical_partitioning(init, names)


class RmsNorm(nn.Module):
  """T5's layer norm: RMS scaling only, no mean subtraction and no bias."""

  dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, x):
    scale = self.param(
        "scale",
        _partitioned(nn.initializers.ones, ("embed",)),
        (x.shape[-1],),
        jnp.float32,
    )
    x = x.astype(jnp.float32)
    variance = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    x = x * lax.rsqrt(variance + RMS_NORM_EPSILON)
    return (x * scale.astype(jnp.float32)).astype(self.dtype)


def project(x, kernel, transposed=False, out_dtype=None, few_rows=False):
  """x [..., K] times a kernel: [K, N], or [N, K] when `transposed`.

  A transposed kernel contracts on its last (contiguous) axis: the same
  product, which XLA:CPU's kernels compute much faster for a few rows
  (`T5Config.transposed_kernels`). With `few_rows` too, a float32 product of
  a few rows runs in spec_decode's CPU kernel, which streams the kernel once
  for all of them (`spec_decode/kernels/few_rows.py`).
  """
  if few_rows and transposed and jnp.dtype(out_dtype or x.dtype) == jnp.float32:
    return few_rows_kernel.product(x, kernel)
  spec = "...k,nk->...n" if transposed else "...k,kn->...n"
  return jnp.einsum(spec, x, kernel, preferred_element_type=out_dtype)


def widening_dot(x, kernel, out_dtype, transposed=False, few_rows=False):
  """x [..., K] @ kernel [K, N] -> out_dtype [..., N], widening only if needed.

  The dot runs in the wider of the two operands' dtypes (only the narrower
  one is cast) and accumulates in out_dtype (`preferred_element_type`):
  bfloat16 activations against bfloat16 weights give float32 logits from
  bfloat16 operands, whose products are exact in float32, with no float32
  copy of the weights. A `transposed` kernel is [N, K] (see `project`).
  """
  dtype = jnp.promote_types(x.dtype, kernel.dtype)
  return project(
      x.astype(dtype), kernel.astype(dtype), transposed, out_dtype, few_rows
  )


class Dense(nn.Module):
  """A bias-free projection of the last axis, with a 2-D named kernel.

  Attributes:
    dtype: the dot's operand and output dtype.
    widening_to: if set, the dot instead runs in the wider of the input's and
      the kernel's dtypes and accumulates in (and returns) this dtype
      (`widening_dot`): the logits projection's float32 from bfloat16
      weights.
    transposed: the kernel is stored [features, in] with its axes' names
      reversed, rather than t5x's [in, features] (see `project`).
    few_rows: a transposed kernel's float32 products of a few rows run in
      spec_decode's CPU kernel (see `project`).
  """

  features: int
  kernel_axes: tuple[str, str]
  dtype: DType = jnp.float32
  kernel_init: Any = nn.initializers.variance_scaling(
      1.0, "fan_in", "truncated_normal"
  )
  widening_to: DType | None = None
  transposed: bool = False
  few_rows: bool = False

  @nn.compact
  def __call__(self, x):
    shape, axes, init = (x.shape[-1], self.features), self.kernel_axes, None
    if self.transposed:
      shape, axes = shape[::-1], axes[::-1]

      def init(rng, shape, dtype):
        # t5x's kernel drawn as t5x draws it (fan-in from its first axis),
        # then transposed: the same values as the [in, out] model's.
        return self.kernel_init(rng, shape[::-1], dtype).T

    kernel = self.param(
        "kernel",
        _partitioned(init or self.kernel_init, axes),
        shape,
        jnp.float32,
    )
    if self.widening_to is not None:
      return widening_dot(
          x, kernel, self.widening_to, self.transposed, self.few_rows
      )
    return project(
        x.astype(self.dtype),
        kernel.astype(self.dtype),
        self.transposed,
        few_rows=self.few_rows,
    )


class Embed(nn.Module):
  """The token embedding, shared by encoder, decoder and (T5 1.0) logits."""

  num_embeddings: int
  features: int
  dtype: DType = jnp.float32

  def setup(self):
    self.embedding = self.param(
        "embedding",
        _partitioned(nn.initializers.normal(stddev=1.0), ("vocab", "embed")),
        (self.num_embeddings, self.features),
        jnp.float32,
    )

  def __call__(self, tokens):
    """Looks up int tokens [...] -> [..., features]."""
    return jnp.take(self.embedding, tokens, axis=0).astype(self.dtype)

  def attend(self, x):
    """Logits of x [..., features] against every embedding, in float32."""
    return widening_dot(x, self.embedding.T, jnp.float32)


def relative_position_bucket(
    relative_position, bidirectional, num_buckets, max_distance
):
  """Maps key_position - query_position to T5's log-spaced buckets.

  Half the buckets are exact small distances; the rest grow logarithmically
  up to `max_distance`, beyond which all distances share the last bucket. In the
  bidirectional (encoder) case, half the buckets are for keys after the query.

  Args:
    relative_position: int32 array of key_position - query_position.
    bidirectional: whether keys after the query get their own buckets.
    num_buckets: the number of buckets.
    max_distance: the distance from which all share one bucket.

  Returns:
    int32 bucket ids, the shape of `relative_position`.
  """
  distance = -relative_position
  bucket = jnp.zeros_like(relative_position)
  if bidirectional:
    num_buckets //= 2
    bucket += (distance < 0).astype(jnp.int32) * num_buckets
    distance = jnp.abs(distance)
  else:
    distance = jnp.maximum(distance, 0)
  max_exact = num_buckets // 2
  is_small = distance < max_exact
  log_ratio = jnp.log(
      distance.astype(jnp.float32) / max_exact + np.finfo(np.float32).eps
  ) / np.log(max_distance / max_exact)
  large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, num_buckets - 1)
  return bucket + jnp.where(is_small, distance, large)


class RelativePositionBias(nn.Module):
  """One bias table per stack, shared by all of its layers.

  The table is a float32 parameter; the biases come out in `dtype`, the
  activation dtype (as t5x computes them), and are gathered once per call per
  stack. Each layer adds them to its float32 attention logits in a fused add.
  """

  num_heads: int
  num_buckets: int
  max_distance: int
  bidirectional: bool
  dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, query_positions, key_positions):
    """Attention biases from absolute positions.

    Args:
      query_positions: int32 [B or 1, T], each query's absolute position.
      key_positions: int32 [S], each key's absolute position.

    Returns:
      [B or 1, heads, T, S] in `dtype`.
    """
    table = self.param(
        "rel_embedding",
        _partitioned(
            nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
            ("heads", "relpos_buckets"),
        ),
        (self.num_heads, self.num_buckets),
        jnp.float32,
    )
    relative = key_positions[None, None, :] - query_positions[:, :, None]
    buckets = relative_position_bucket(
        relative, self.bidirectional, self.num_buckets, self.max_distance
    )
    # [H, buckets] -> [H, B, T, S] -> [B, H, T, S]
    bias = jnp.take(table.astype(self.dtype), buckets, axis=1)
    return jnp.transpose(bias, (1, 0, 2, 3))


class Mlp(nn.Module):
  """T5's MLP: the product of activated `wi`s, then `wo`.

  ('relu',) is T5 1.0 (one `wi`); ('gelu', 'linear') is T5 1.1's gated GELU
  (`wi_0`, `wi_1`).
  """

  mlp_dim: int
  activations: Sequence[str]
  dtype: DType = jnp.float32
  transposed_kernels: bool = False
  few_rows_kernel: bool = False

  @nn.compact
  def __call__(self, x):
    dense = functools.partial(
        Dense,
        dtype=self.dtype,
        transposed=self.transposed_kernels,
        few_rows=self.few_rows_kernel,
    )
    hidden = None
    for i, name in enumerate(self.activations):
      dense_name = "wi" if len(self.activations) == 1 else f"wi_{i}"
      h = dense(self.mlp_dim, ("embed", "mlp"), name=dense_name)(x)
      h = h if name == "linear" else getattr(nn, name)(h)
      hidden = h if hidden is None else hidden * h
    return dense(x.shape[-1], ("mlp", "embed"), name="wo")(hidden)
