"""The building blocks of spec_decode.models.layers against references written
out independently: T5's RMS norm in float64, and the relative position buckets
and biases at key - query (the attention's: tests/attention_test.py)."""

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
