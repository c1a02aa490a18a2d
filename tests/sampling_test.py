"""Tests for spec_decode.sampling."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from spec_decode import sampling


def _reference_probs(logits, temperature, top_k, top_p):
  """Row by row in float64: temperature, then top-k, then top-p."""
  rows = np.asarray(logits, np.float64).reshape(-1, logits.shape[-1])
  out = np.zeros_like(rows)
  for i, row in enumerate(rows):
    row = row / temperature
    if top_k:
      kth_largest = np.sort(row)[::-1][top_k - 1]
      row = np.where(row >= kth_largest, row, -np.inf)
    probs = np.exp(row - row.max())
    probs /= probs.sum()
    kept, mass = [], 0.0
    for token in np.argsort(-probs, kind="stable"):
      kept.append(token)
      mass += probs[token]
      if mass >= top_p:
        break
    probs = np.where(probs >= probs[kept].min(), probs, 0.0)
    out[i] = probs / probs.sum()
  return out.reshape(logits.shape)


class LogitsToProbsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("temperature", 0.7, 0, 1.0),
      ("top_k", 1.0, 3, 1.0),
      ("top_p", 1.0, 0, 0.8),
      ("all_three", 0.6, 5, 0.7),
      ("top_k_1", 1.3, 1, 1.0),
  )
  def test_matches_reference_on_3d_input(self, temperature, top_k, top_p):
    logits = 2.0 * jax.random.normal(jax.random.key(0), (3, 4, 10))
    config = sampling.SamplingConfig(temperature, top_k, top_p)
    probs = sampling.logits_to_probs(logits, config)
    self.assertEqual(probs.shape, (3, 4, 10))
    self.assertEqual(probs.dtype, jnp.float32)
    np.testing.assert_allclose(
        probs, _reference_probs(logits, temperature, top_k, top_p), atol=1e-6
    )
    # Each row of the 3-D result equals the 2-D computation on that slice.
    for t in range(4):
      np.testing.assert_array_equal(
          probs[:, t], sampling.logits_to_probs(logits[:, t], config)
      )

  def test_top_k_keeps_exactly_k_without_ties(self):
    logits = jax.random.normal(jax.random.key(1), (2, 5, 12))
    probs = sampling.logits_to_probs(logits, sampling.SamplingConfig(top_k=4))
    np.testing.assert_array_equal(np.sum(probs > 0, axis=-1), 4)

  def test_top_p_keeps_ties_at_the_boundary(self):
    logits = jnp.log(jnp.array([0.4, 0.2, 0.2, 0.2]))
    probs = sampling.logits_to_probs(logits, sampling.SamplingConfig(top_p=0.5))
    np.testing.assert_allclose(probs, [0.4, 0.2, 0.2, 0.2], rtol=1e-6)
    probs = sampling.logits_to_probs(logits, sampling.SamplingConfig(top_p=0.4))
    np.testing.assert_allclose(probs, [1, 0, 0, 0])

  def test_greedy_is_one_hot_with_ties_to_the_lowest_id(self):
    logits = jnp.array([[[0.0, 3.0, 1.0, 3.0]], [[5.0, 5.0, 5.0, 5.0]]])
    probs = sampling.logits_to_probs(
        logits, sampling.SamplingConfig(temperature=0.0)
    )
    np.testing.assert_array_equal(probs, [[[0, 1, 0, 0]], [[1, 0, 0, 0]]])
    self.assertEqual(probs.dtype, jnp.float32)

  def test_greedy_tokens_is_the_argmax_of_the_greedy_one_hot(self):
    logits = jnp.round(jax.random.normal(jax.random.key(7), (4, 3, 50)))
    tokens = sampling.greedy_tokens(logits)  # Rounding makes ties.
    self.assertEqual(tokens.dtype, jnp.int32)
    np.testing.assert_array_equal(tokens, np.argmax(logits, axis=-1))
    probs = sampling.logits_to_probs(logits, sampling.SamplingConfig(0.0))
    np.testing.assert_array_equal(jax.nn.one_hot(tokens, 50), probs)
    chosen, chosen_probs = sampling.choose(
        jax.random.key(0), logits, sampling.SamplingConfig(0.0)
    )
    np.testing.assert_array_equal(chosen, tokens)
    self.assertIsNone(chosen_probs)

  def test_bfloat16_logits_give_float32_probs(self):
    logits = jax.random.normal(jax.random.key(2), (2, 3, 50), jnp.bfloat16)
    config = sampling.SamplingConfig(temperature=0.6, top_k=20, top_p=0.9)
    probs = sampling.logits_to_probs(logits, config)
    self.assertEqual(probs.dtype, jnp.float32)
    np.testing.assert_allclose(
        probs,
        _reference_probs(logits.astype(np.float32), 0.6, 20, 0.9),
        atol=1e-6,
    )

  def test_minus_infinity_logits_get_probability_zero(self):
    logits = jnp.array([[-jnp.inf, 0.0, -jnp.inf, 1.0]])
    for config in [
        sampling.SamplingConfig(),
        sampling.SamplingConfig(temperature=0.5, top_k=3, top_p=0.9),
    ]:
      probs = sampling.logits_to_probs(logits, config)
      self.assertTrue(np.all(np.isfinite(probs)))
      np.testing.assert_array_equal(probs[0, [0, 2]], 0.0)

  @parameterized.named_parameters(
      ("negative_temperature", dict(temperature=-0.1), "temperature"),
      ("nan_temperature", dict(temperature=float("nan")), "temperature"),
      ("negative_top_k", dict(top_k=-1), "top_k"),
      ("float_top_k", dict(top_k=2.5), "top_k"),
      ("zero_top_p", dict(top_p=0.0), "top_p"),
      ("large_top_p", dict(top_p=1.5), "top_p"),
  )
  def test_invalid_arguments_raise(self, kwargs, name):
    with self.assertRaisesRegex(ValueError, f"^{name} must be"):
      sampling.SamplingConfig(**kwargs)


class SampleTest(absltest.TestCase):

  def test_frequencies_match_unnormalized_weights(self):
    weights = jnp.array([0.0, 2.0, 1.0, 0.0, 5.0, 2.0])
    num_draws = 40_000
    tokens = sampling.sample(
        jax.random.key(3), jnp.broadcast_to(weights, (num_draws, 6))
    )
    self.assertEqual(tokens.dtype, jnp.int32)
    counts = np.bincount(tokens, minlength=6)
    np.testing.assert_array_equal(counts[[0, 3]], 0)
    expected = num_draws * np.asarray(weights)[[1, 2, 4, 5]] / 10
    _, p_value = scipy.stats.chisquare(counts[[1, 2, 4, 5]], expected)
    self.assertGreater(p_value, 1e-3)

  def test_frequencies_across_blocks_with_padding(self):
    # V = 150 spans three blocks of 64, the last one padded; whole blocks and
    # scattered tokens have weight 0.
    weights = np.asarray(
        jax.random.uniform(jax.random.key(5), (150,)), np.float64
    )
    weights[64:128] = 0.0
    weights[::7] = 0.0
    num_draws = 200_000
    tokens = sampling.sample(
        jax.random.key(6),
        jnp.broadcast_to(jnp.asarray(weights, jnp.float32), (num_draws, 150)),
    )
    counts = np.bincount(tokens, minlength=150)
    self.assertEqual(len(counts), 150)
    np.testing.assert_array_equal(counts[weights == 0], 0)
    support = weights > 0
    expected = num_draws * weights[support] / weights[support].sum()
    _, p_value = scipy.stats.chisquare(counts[support], expected)
    self.assertGreater(p_value, 1e-3)

  def test_3d_input(self):
    probs = jax.nn.one_hot(jnp.array([[1, 2], [0, 3]]), 4)
    np.testing.assert_array_equal(
        sampling.sample(jax.random.key(4), probs), [[1, 2], [0, 3]]
    )


if __name__ == "__main__":
  absltest.main()
