"""The building blocks of spec_decode.models.layers against references written
out independently: T5's RMS norm in float64, the attention's softmax in t5x's
order, and the relative position buckets and biases at key - query."""

from absl.testing import absltest
from absl.testing import parameterized
from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.models import layers


class RmsNormTest(absltest.TestCase):

  def test_matches_float64_reference(self):
    # x / sqrt(mean(x^2) + eps) * scale: no mean subtraction, no bias. The
    # inputs' mean (3) is large against their spread (1), so a norm that
    # centred x would be off by a factor of about sqrt(10); the last row is
    # constant, which such a norm would scale by 1 / sqrt(eps).
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 1.0, size=(2, 3, 64)).astype(np.float32)
    x[1, 2] = 2.5
    scale = rng.uniform(0.5, 1.5, size=64).astype(np.float32)
    module = layers.RmsNorm(jnp.float32)
    # One parameter, the scale: no bias.
    variables = nn.unbox(module.init(jax.random.key(0), x))
    self.assertEqual(
        jax.tree.map(np.shape, variables), {"params": {"scale": (64,)}}
    )
    got = module.apply({"params": {"scale": jnp.asarray(scale)}}, x)
    self.assertEqual(got.dtype, jnp.float32)
    x64, scale64 = x.astype(np.float64), scale.astype(np.float64)
    want = (
        x64 / np.sqrt(np.mean(x64**2, axis=-1, keepdims=True) + 1e-6) * scale64
    )
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def _t5_buckets(relative, bidirectional):
  """T5's buckets (32 of them, max_distance 128) of key - query positions.

  Only for distances that T5 maps in closed form: the exact ones (below 8
  each way when bidirectional, below 16 otherwise) and those from
  max_distance on (all in the last bucket of their side).
  """
  distance = np.abs(relative)
  exact = 8 if bidirectional else 16
  assert np.all((distance < exact) | (distance >= 128)), relative
  if bidirectional:
    # Keys after the query (relative > 0) take the upper 16 buckets.
    side = np.where(relative > 0, 16, 0)
    return side + np.where(distance < 8, distance, 15)
  # Keys after the query share bucket 0 (the decoder masks them out).
  past = np.maximum(-relative, 0)
  return np.where(past < 16, past, 31)


class RelativePositionBiasTest(parameterized.TestCase):

  @parameterized.named_parameters(("encoder", True), ("decoder", False))
  def test_bias_at_key_minus_query(self, bidirectional):
    # T5's relative position is the memory (key) position minus the query
    # position. The table's entry for head h and bucket k is 100 h + k, so
    # the biases show which bucket each (query, key) pair was given.
    query_positions = np.array([[3, 4], [5, 300]], np.int32)  # [B=2, T=2]
    key_positions = np.array(list(range(10)) + [300], np.int32)  # [S=11]
    heads, buckets = 4, 32
    table = (
        100 * np.arange(heads)[:, None] + np.arange(buckets)[None, :]
    ).astype(np.float32)
    module = layers.RelativePositionBias(heads, buckets, 128, bidirectional)
    bias = module.apply(
        {"params": {"rel_embedding": jnp.asarray(table)}},
        jnp.asarray(query_positions),
        jnp.asarray(key_positions),
    )
    relative = key_positions[None, None, :] - query_positions[:, :, None]
    want = np.transpose(
        table[:, _t5_buckets(relative, bidirectional)], (1, 0, 2, 3)
    )
    self.assertEqual(bias.shape, (2, heads, 2, 11))
    np.testing.assert_array_equal(bias, want)
    # Spelled out for head 0 and the query at position 3: keys 0..2 are
    # 3, 2, 1 back; keys 4..9 and 300 are ahead.
    if bidirectional:
      row = [3, 2, 1, 0, 17, 18, 19, 20, 21, 22, 31]
    else:
      row = [3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    np.testing.assert_array_equal(bias[0, 0, 0], row)


def _reference_attention(query, key, value, bias, mask):
  """t5x's order in float64: softmax over the keys, then the values."""
  query, key, value, bias = (
      np.asarray(x, np.float64) for x in (query, key, value, bias)
  )
  logits = np.einsum("bthd,bhds->bhts", query, key) + bias
  logits = np.where(mask, logits, layers.MASK_VALUE)
  weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
  weights /= weights.sum(axis=-1, keepdims=True)
  return np.einsum("bhts,bhsd->bthd", weights, value)


class DotProductAttentionTest(parameterized.TestCase):
  """Normalized after the values' product, the softmax is still t5x's."""

  def _inputs(self, dtype):
    b, t, h, d, s = 2, 3, 4, 8, 11
    keys = jax.random.split(jax.random.key(0), 4)
    query = 2 * jax.random.normal(keys[0], (b, t, h, d))
    key = jax.random.normal(keys[1], (b, h, d, s))
    value = jax.random.normal(keys[2], (b, h, s, d))
    bias = jax.random.normal(keys[3], (1, h, t, s))
    # Row 0 sees 7 keys; row 1 sees every key.
    mask = (jnp.arange(s) < jnp.array([7, s])[:, None])[:, None, None, :]
    return tuple(x.astype(dtype) for x in (query, key, value, bias)) + (mask,)

  def test_float32_matches_softmax_then_values(self):
    inputs = self._inputs(jnp.float32)
    out = layers.dot_product_attention(*inputs, dtype=jnp.float32)
    np.testing.assert_allclose(
        out, _reference_attention(*inputs), rtol=0, atol=2e-6
    )

  def test_masked_keys_have_no_weight(self):
    query, key, value, bias, mask = self._inputs(jnp.float32)
    far = jnp.where(mask[:, :, 0, :, None], value, 1e6)
    np.testing.assert_array_equal(
        layers.dot_product_attention(query, key, far, bias, mask, jnp.float32),
        layers.dot_product_attention(
            query, key, value, bias, mask, jnp.float32
        ),
    )

  def test_bfloat16_is_no_less_accurate_than_t5x_order(self):
    # t5x casts the normalized float32 weights to bfloat16 before the values'
    # product; here the unnormalized ones are cast and each output is divided
    # in float32. Both round the weights once and the output once.
    query, key, value, bias, mask = self._inputs(jnp.bfloat16)
    exact = _reference_attention(query, key, value, bias, mask)
    logits = jnp.einsum(
        "bthd,bhds->bhts", query, key, preferred_element_type=jnp.float32
    )
    logits = jnp.where(mask, logits + bias, layers.MASK_VALUE)
    weights = jax.nn.softmax(logits, axis=-1).astype(jnp.bfloat16)
    t5x = jnp.einsum("bhts,bhsd->bthd", weights, value)
    out = layers.dot_product_attention(
        query, key, value, bias, mask, jnp.bfloat16
    )
    self.assertEqual(out.dtype, jnp.bfloat16)
    error = np.abs(np.asarray(out, np.float64) - exact).max()
    t5x_error = np.abs(np.asarray(t5x, np.float64) - exact).max()
    self.assertLessEqual(error, t5x_error)
    # Within a few bfloat16 ulps of values of magnitude about 1.
    self.assertLess(error, 2e-2)


def _dot_count(fn, *args):
  """The dot_general equations in fn's jaxpr, nested ones included."""

  def count(jaxpr):
    total = 0
    for eqn in jaxpr.eqns:
      total += eqn.primitive.name == "dot_general"
      for sub in jax.core.jaxprs_in_params(eqn.params):
        total += count(sub)
    return total

  return count(jax.make_jaxpr(fn)(*args).jaxpr)


class PerQueryAttentionTest(parameterized.TestCase):
  """per_query: each of a few queries attends as a call with it alone."""

  def _inputs(self, num_queries):
    b, h, d, s = 2, 4, 8, 11
    keys = jax.random.split(jax.random.key(1), 4)
    query = 2 * jax.random.normal(keys[0], (b, num_queries, h, d))
    key = jax.random.normal(keys[1], (b, h, d, s))
    value = jax.random.normal(keys[2], (b, h, s, d))
    # A bias and a causal mask that differ from query to query, and a
    # padding mask that does not (the cross-attention's [B, 1, 1, S]).
    bias = jax.random.normal(keys[3], (1, h, num_queries, s))
    causal = (jnp.arange(s) <= 6 + jnp.arange(num_queries)[:, None])[None, None]
    padding = (jnp.arange(s) < jnp.array([9, s])[:, None])[:, None, None, :]
    return query, key, value, bias, causal & padding, padding

  def test_each_query_as_if_alone(self):
    query, key, value, bias, causal, padding = self._inputs(3)
    for mask, mask_of in (
        (causal, lambda t: causal[:, :, t : t + 1]),
        (padding, lambda t: padding),
    ):
      got = layers.dot_product_attention(
          query, key, value, bias, mask, jnp.float32, per_query=True
      )
      alone = [
          layers.dot_product_attention(
              query[:, t : t + 1],
              key,
              value,
              bias[:, :, t : t + 1],
              mask_of(t),
              jnp.float32,
          )
          for t in range(3)
      ]
      np.testing.assert_array_equal(got, jnp.concatenate(alone, axis=1))
      np.testing.assert_allclose(
          got,
          _reference_attention(query, key, value, bias, mask),
          rtol=0,
          atol=2e-6,
      )

  @parameterized.parameters(
      (1, True, 2), (3, True, 6), (16, True, 32), (17, True, 2), (3, False, 2)
  )
  def test_unrolls_only_a_few_queries(self, num_queries, per_query, dots):
    # Two dots a query up to PER_QUERY_MAX_QUERIES; past it (a decoder's
    # training pass) one batched pair, as without per_query.
    query, key, value, bias, causal, _ = self._inputs(num_queries)
    attend = lambda q: layers.dot_product_attention(
        q, key, value, bias, causal, jnp.float32, per_query=per_query
    )
    self.assertEqual(_dot_count(attend, query), dots)


class RelativePositionBucketTest(absltest.TestCase):

  def test_matches_reference_formula(self):
    # The reference: T5's bucketing written out with numpy, one distance at a
    # time (as in the Mesh TensorFlow and transformers implementations).
    def reference(relative, bidirectional, num_buckets=32, max_distance=128):
      bucket = 0
      if bidirectional:
        num_buckets //= 2
        bucket += num_buckets if relative > 0 else 0
        distance = abs(relative)
      else:
        distance = max(-relative, 0)
      max_exact = num_buckets // 2
      if distance < max_exact:
        return bucket + distance
      large = max_exact + int(
          np.log(np.float32(distance) / max_exact)
          / np.log(max_distance / max_exact)
          * (num_buckets - max_exact)
      )
      return bucket + min(large, num_buckets - 1)

    relative = np.arange(-600, 600)
    for bidirectional in (True, False):
      got = layers.relative_position_bucket(
          jnp.asarray(relative), bidirectional, 32, 128
      )
      want = [reference(r, bidirectional) for r in relative]
      np.testing.assert_array_equal(got, want)

  def test_bias_in_the_activation_dtype(self):
    # The float32 table's entries, looked up at each (query, key) bucket and
    # rounded once to the activation dtype; laid out [B, H, T, S].
    query_positions = jnp.asarray([[3, 4], [7, 8]])  # [B=2, T=2]
    key_positions = jnp.arange(10)
    for dtype in (jnp.float32, jnp.bfloat16):
      module = layers.RelativePositionBias(4, 32, 128, False, dtype)
      variables = module.init(jax.random.key(0), query_positions, key_positions)
      bias = module.apply(variables, query_positions, key_positions)
      self.assertEqual(bias.dtype, dtype)
      self.assertEqual(bias.shape, (2, 4, 2, 10))
      table = np.asarray(variables["params"]["rel_embedding"].unbox())
      self.assertEqual(table.dtype, np.float32)
      buckets = layers.relative_position_bucket(
          key_positions[None, None, :] - query_positions[:, :, None],
          False,
          32,
          128,
      )
      want = np.transpose(table[:, np.asarray(buckets)], (1, 0, 2, 3))
      np.testing.assert_array_equal(bias, jnp.asarray(want).astype(dtype))


if __name__ == "__main__":
  absltest.main()
