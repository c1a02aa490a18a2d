"""spec_decode/kernels/few_queries: a decode call's attention in one CPU call.

The reference is T5 attention in float64 NumPy (softmax over the keys, then
the values); the kernel computes in float32, so the tolerance is float32
rounding. Its lossless use rests on exact equalities: each query, and each
row, as if alone, and keys masked after the last valid one adding nothing.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.kernels import few_queries
from spec_decode.models import attention

# float32 rounding over about 100 keys of weights and values of magnitude 1.
_ATOL = 2e-6


def _reference(query, key, value, bias, mask):
  query, key, value = (np.asarray(x, np.float64) for x in (query, key, value))
  logits = np.einsum("bthd,bhds->bhts", query, key)
  if bias is not None:
    logits = logits + np.asarray(bias, np.float64)
  logits = np.where(mask, logits, attention.MASK_VALUE)
  weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
  weights /= weights.sum(axis=-1, keepdims=True)
  return np.einsum("bhts,bhsd->bthd", weights, value)


def _inputs(b, t, h, d, s, seed=0):
  """query, key, value, a bias [1, H, T, S], a causal mask [1, 1, T, S] that
  differs by query, and a padding mask [B, 1, 1, S] that differs by row.

  The query is scaled by 2 / sqrt(d), as T5's initialization folds in 1 /
  sqrt(d): logits of about +-2 before the bias.
  """
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  query = 2 / np.sqrt(d) * normal(b, t, h, d)
  key, value, bias = normal(b, h, d, s), normal(b, h, s, d), normal(1, h, t, s)
  causal = (np.arange(s) <= s - t + np.arange(t)[:, None])[None, None]
  lengths = np.minimum(s, np.arange(b) * 3 + max(s - 3 * b, 1))
  padding = (np.arange(s) < lengths[:, None])[:, None, None, :]
  return query, key, value, bias, jnp.asarray(causal), jnp.asarray(padding)


_attend = jax.jit(few_queries.attention)


class FewQueriesTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.assertTrue(few_queries.available(), "the kernel did not build")

  @parameterized.product(
      shape=[
          (1, 1, 1, 8, 8),  # one query, one head, one block of keys
          (2, 4, 8, 64, 72),  # the demo's verification call
          (2, 3, 4, 12, 11),  # head size and keys not multiples of 8
          (1, 16, 2, 8, 5),  # fewer keys than a block
          (3, 2, 3, 64, 130),  # more than 8 blocks of keys
          (1, 2, 2, 72, 16),  # more than 8 blocks of head dimensions
      ],
      self_attention=[True, False],
  )
  def test_matches_float64_attention(self, shape, self_attention):
    query, key, value, bias, causal, padding = _inputs(*shape)
    # Self-attention: a bias and a causal mask per query; cross-attention:
    # no bias and a padding mask per row.
    bias, mask = (bias, causal & padding) if self_attention else (None, padding)
    got = _attend(query, key, value, bias, mask)
    self.assertEqual(got.shape, query.shape)
    np.testing.assert_allclose(
        got, _reference(query, key, value, bias, mask), rtol=0, atol=_ATOL
    )

  @parameterized.parameters(2, 4, 16)
  def test_each_query_as_if_alone(self, num_queries):
    query, key, value, bias, causal, padding = _inputs(
        2, num_queries, 4, 64, 40
    )
    mask = causal & padding
    alone = [
        _attend(
            query[:, t : t + 1],
            key,
            value,
            bias[:, :, t : t + 1],
            mask[:, :, t : t + 1],
        )
        for t in range(num_queries)
    ]
    np.testing.assert_array_equal(
        _attend(query, key, value, bias, mask), jnp.concatenate(alone, axis=1)
    )

  def test_each_row_as_if_alone(self):
    query, key, value, bias, causal, padding = _inputs(3, 4, 4, 64, 40)
    mask = causal & padding
    got = _attend(query, key, value, bias, mask)
    for row in range(3):
      one = slice(row, row + 1)
      np.testing.assert_array_equal(
          got[one],
          _attend(query[one], key[one], value[one], bias, mask[one]),
      )

  @parameterized.parameters(1, 7, 8, 9, 40)
  def test_keys_masked_after_the_last_valid_one_change_nothing(self, extra):
    # A decode loop may attend over more of the cache than the rows have
    # filled (its key bound): those keys, whatever they hold, are masked,
    # and the outputs stay bit-identical, so a query's output does not
    # depend on how far the cache reaches.
    query, key, value, bias, causal, _ = _inputs(2, 4, 4, 64, 29)
    rng = np.random.default_rng(3)
    pad = lambda x, axis: jnp.concatenate(
        [
            x,
            jnp.asarray(
                1e6 * rng.standard_normal(x.shape[:axis] + (extra,)),
                jnp.float32,
            ),
        ],
        axis=axis,
    )
    longer_key = pad(key, 3)
    longer_value = jnp.swapaxes(pad(jnp.swapaxes(value, 2, 3), 3), 2, 3)
    longer_bias = pad(bias, 3)
    longer_mask = jnp.pad(causal, ((0, 0),) * 3 + ((0, extra),))
    np.testing.assert_array_equal(
        _attend(query, longer_key, longer_value, longer_bias, longer_mask),
        _attend(query, key, value, bias, causal),
    )

  def test_a_row_with_no_valid_key_averages_the_values(self):
    # As XLA's version: every logit MASK_VALUE, so a uniform softmax, and no
    # NaN.
    query, key, value, bias, _, _ = _inputs(1, 2, 2, 8, 11)
    mask = jnp.zeros((1, 1, 2, 11), bool)
    got = _attend(query, key, value, bias, mask)
    # [B, H, S, D] -> [B, 1, H, D], each head's mean value.
    means = np.asarray(value, np.float64).mean(axis=2)[:, None]
    expected = np.broadcast_to(means, got.shape)
    np.testing.assert_allclose(got, expected, rtol=0, atol=_ATOL)

  @parameterized.parameters(-200.0, -90.0, -80.0, 40.0, 85.0)
  def test_large_logits(self, shift):
    # The kernel's exp near and past float32's range: logits of shift +- 100,
    # the query 0 so that they are the bias exactly (and the reference's are
    # the same float32 numbers). Past float32's range weights are 0, as
    # XLA's exp makes them.
    _, key, value, _, causal, _ = _inputs(1, 3, 2, 8, 20)
    query = jnp.zeros((1, 3, 2, 8), jnp.float32)
    rng = np.random.default_rng(4)
    bias = jnp.asarray(
        shift + 100 * rng.uniform(-1, 1, (1, 2, 3, 20)), jnp.float32
    )
    got = _attend(query, key, value, bias, causal)
    self.assertTrue(np.all(np.isfinite(got)))
    np.testing.assert_allclose(
        got, _reference(query, key, value, bias, causal), rtol=0, atol=_ATOL
    )

  def test_softmax_weights_to_float32_rounding(self):
    # With one-hot values the outputs are the softmax weights themselves,
    # each checked to a few float32 ulps of its float64 value: the exp's
    # error (within 2 ulp) shows here undiluted.
    s = 16
    query, key, _, bias, causal, _ = _inputs(1, 2, 2, s, s)
    value = jnp.broadcast_to(jnp.eye(s, dtype=jnp.float32), (1, 2, s, s))
    got = np.asarray(_attend(query, key, value, bias, causal), np.float64)
    expected = _reference(query, key, value, bias, causal)
    np.testing.assert_allclose(got, expected, rtol=4e-7 * 8, atol=1e-30)

  def test_vmap(self):
    query, key, value, bias, causal, _ = _inputs(1, 3, 2, 8, 12)
    stacked = lambda x: jnp.stack([x, 2 * x])
    got = jax.jit(
        jax.vmap(few_queries.attention, in_axes=(0, 0, 0, None, None))
    )(stacked(query), stacked(key), stacked(value), bias, causal)
    for i in range(2):
      np.testing.assert_array_equal(
          got[i],
          _attend(*(stacked(x)[i] for x in (query, key, value)), bias, causal),
      )

  def test_operands_that_do_not_broadcast_are_refused(self):
    # A bias of 3 queries for a call of 2 would be read past its end.
    query, key, value, _, causal, _ = _inputs(1, 2, 2, 8, 12)
    bias = jnp.zeros((1, 2, 3, 12), jnp.float32)
    with self.assertRaisesRegex(Exception, "broadcastable to"):
      jax.block_until_ready(_attend(query, key, value, bias, causal))

  def test_applies_to_few_float32_queries(self):
    query, key, value, *_ = _inputs(1, 16, 2, 8, 12)
    self.assertTrue(few_queries.applies(query, key, value))
    self.assertFalse(
        few_queries.applies(jnp.concatenate([query, query], 1), key, value)
    )
    bf16 = lambda x: x.astype(jnp.bfloat16)
    self.assertFalse(few_queries.applies(bf16(query), bf16(key), bf16(value)))


if __name__ == "__main__":
  absltest.main()
