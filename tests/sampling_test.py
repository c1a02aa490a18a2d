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


class SamplingConfigTest(parameterized.TestCase):
  """A config is a pytree: its temperature and top_p are leaves, traced in a
  jitted loop; what changes a loop's program (greedy, top_k, top_p < 1) is
  its structure."""

  def test_leaves_and_structure(self):
    config = sampling.SamplingConfig(temperature=0.6, top_k=3, top_p=0.8)
    leaves, treedef = jax.tree.flatten(config)
    self.assertEqual(leaves, [0.6, 0.8])
    self.assertEqual(jax.tree.unflatten(treedef, leaves), config)
    self.assertEqual(
        treedef, jax.tree.structure(sampling.SamplingConfig(1.3, 3, 0.5))
    )
    for other in (
        sampling.SamplingConfig(0.0, 3, 0.8),  # greedy
        sampling.SamplingConfig(0.6, 4, 0.8),  # another top_k
        sampling.SamplingConfig(0.6, 3, 1.0),  # no nucleus
    ):
      self.assertNotEqual(treedef, jax.tree.structure(other))

  def test_numpy_scalars_become_python_numbers(self):
    config = sampling.SamplingConfig(np.float64(0.5), 2, np.float32(1))
    self.assertEqual(config, sampling.SamplingConfig(0.5, 2, 1.0))
    self.assertEqual(
        [type(leaf) for leaf in jax.tree.leaves(config)], [float, float]
    )
    self.assertFalse(config.nucleus)

  def test_one_program_for_every_temperature_and_top_p(self):
    logits = jax.random.normal(jax.random.key(0), (4, 50)) * 3
    to_probs = jax.jit(sampling.logits_to_probs)
    for temperature, top_p in ((0.6, 0.8), (1.7, 0.5), (0.25, 0.95)):
      config = sampling.SamplingConfig(temperature, 5, top_p)
      np.testing.assert_allclose(
          to_probs(logits, config),
          _reference_probs(np.asarray(logits), temperature, 5, top_p),
          rtol=1e-5,
          atol=1e-7,
      )
    self.assertEqual(to_probs._cache_size(), 1)  # pylint: disable=protected-access


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

  @parameterized.parameters(0.5, 0.9, 0.999)
  def test_top_p_under_top_k_sorts_only_k(self, top_p):
    # Ties at the k-th logit: the nucleus may reach past k tokens.
    logits = jnp.round(jax.random.normal(jax.random.key(2), (6, 300)), 1)
    config = sampling.SamplingConfig(0.8, 7, top_p)
    probs = sampling.logits_to_probs(logits, config)
    np.testing.assert_allclose(
        probs, _reference_probs(logits, 0.8, 7, top_p), atol=1e-6
    )
    top_k_only = sampling.logits_to_probs(
        logits, sampling.SamplingConfig(0.8, 7)
    )
    self.assertTrue(np.any(np.sum(top_k_only > 0, axis=-1) > 7))
    text = (
        jax.jit(sampling.logits_to_probs, static_argnums=1)
        .lower(logits, config)
        .as_text()
    )
    self.assertNotIn("sort", text)

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
        jnp.zeros((4, 3, 2)), logits, sampling.SamplingConfig(0.0)
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
      # A gin binding of a string or a bool: not a TypeError, not top_k 1.
      ("string_temperature", dict(temperature="hot"), "temperature"),
      ("bool_temperature", dict(temperature=True), "temperature"),
      ("negative_top_k", dict(top_k=-1), "top_k"),
      ("float_top_k", dict(top_k=2.5), "top_k"),
      ("bool_top_k", dict(top_k=True), "top_k"),
      ("zero_top_p", dict(top_p=0.0), "top_p"),
      ("large_top_p", dict(top_p=1.5), "top_p"),
      ("string_top_p", dict(top_p="0.9"), "top_p"),
  )
  def test_invalid_arguments_raise(self, kwargs, name):
    with self.assertRaisesRegex(ValueError, f"^{name} must be"):
      sampling.SamplingConfig(**kwargs)

  def test_numpy_scalars_are_numbers(self):
    config = sampling.SamplingConfig(
        temperature=np.float32(0.5), top_p=np.float64(0.9)
    )
    self.assertEqual((config.temperature, config.top_p), (0.5, 0.9))


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

  def test_pick_never_takes_a_zero_weight_step_of_the_cdf(self):
    # jnp.cumsum rounds as a tree, so a weight-0 index can own a step of the
    # computed cdf (of either sign). u at the top of every such step must
    # still land on a positive weight; the textbook count of cdf < u takes
    # the zero. Half the weights are 0, as top-k, top-p and residuals make.
    rows, size = 2_000, 503
    key_w, key_z = jax.random.split(jax.random.key(11))
    weights = jax.random.uniform(key_w, (rows, size))
    weights = jnp.where(
        jax.random.bernoulli(key_z, 0.5, (rows, size)), weights, 0.0
    )
    cdf = jnp.cumsum(weights, axis=-1)
    previous = jnp.pad(cdf[:, :-1], ((0, 0), (1, 0)))
    row, col = np.nonzero(np.asarray((weights == 0) & (cdf != previous)))
    self.assertGreater(len(row), 100)  # The defect is there to catch.
    picked = sampling.pick(weights[row], cdf[row], cdf[row, col][:, None])
    self.assertTrue(np.all(np.asarray(weights[row, picked]) > 0))

  def test_pick_with_trailing_zeros_and_u_at_the_total(self):
    weights = jnp.array([[0.0, 1.0, 2.0, 0.0, 0.0]])
    cdf = jnp.array([[0.0, 1.0, 3.0, 3.0000002, 3.0000005]])  # Rounding.
    for u, expected in ((1e-9, 1), (1.0, 1), (1.5, 2), (3.0000005, 2)):
      self.assertEqual(
          int(sampling.pick(weights, cdf, jnp.array([[u]]))[0]), expected
      )

  def test_no_zero_weight_token_at_t5_vocabulary_size(self):
    # V = 32128 (T5's), half the weights 0 at random places: across 256 rows
    # and 64 draws each, no zero-weight token; and one row's 200,000 draws
    # fit its weights (chi-square over 100 bins of equal mass, 99 degrees of
    # freedom, p > 1e-3; a 5% error in one bin's mass gives a statistic
    # about 50 above the mean, far past the 1e-3 tail at 99 + 54).
    vocab_size = 32_128
    key_w, key_z, key_draw, key_one = jax.random.split(jax.random.key(12), 4)
    weights = jax.random.exponential(key_w, (256, vocab_size))
    weights = jnp.where(
        jax.random.bernoulli(key_z, 0.5, weights.shape), weights, 0.0
    )
    tokens = jax.vmap(lambda k: sampling.sample(k, weights))(
        jax.random.split(key_draw, 64)
    )  # [64, 256]
    drawn = np.asarray(
        jnp.take_along_axis(weights[None], tokens[..., None], -1)
    )
    self.assertTrue(np.all(drawn > 0))

    row = np.asarray(weights[0], np.float64)
    num_draws = 200_000
    tokens = jax.vmap(lambda k: sampling.sample(k, weights[0]))(
        jax.random.split(key_one, num_draws)
    )
    counts = np.bincount(np.asarray(tokens), minlength=vocab_size)
    self.assertEqual(int(counts[row == 0].sum()), 0)
    mass = np.cumsum(row) / row.sum()
    bins = np.minimum((mass * 100).astype(int), 99)  # [V] bin of each token.
    observed = np.bincount(bins, weights=counts, minlength=100)
    expected = num_draws * np.bincount(bins, weights=row, minlength=100)
    _, p_value = scipy.stats.chisquare(observed, expected / row.sum())
    self.assertGreater(p_value, 1e-3)

  def test_nan_rows_draw_inside_the_vocabulary(self):
    logits = jnp.array([[jnp.nan] * 5, [0.0, jnp.nan, 1.0, 0.0, 0.0]])
    self.assertEqual(sampling.greedy_tokens(logits).tolist(), [4, 4])
    probs = sampling.logits_to_probs(logits, sampling.SamplingConfig())
    tokens = sampling.sample(jax.random.key(0), probs)
    self.assertTrue(np.all((0 <= tokens) & (tokens < 5)))
    np.testing.assert_array_equal(
        sampling.nonfinite_rows(
            jnp.array([[0.0, 1.0], [jnp.inf, 0.0], [-jnp.inf, 0.0]])
        ),
        [False, True, True],
    )

  def test_nonfinite_rows_compiled(self):
    # Compiled, as in the decoding loops, in both dtypes the models run in.
    logits = np.zeros((2, 3, 7), np.float32)
    logits[0, 1, 6] = np.inf
    logits[1, 0, 0] = -np.inf
    logits[1, 2, 3] = np.nan
    logits[0, 2] = 3e38  # Finite in float32 and bfloat16, however large.
    expected = [[False, True, False], [True, False, True]]
    for dtype in (jnp.float32, jnp.bfloat16):
      with self.subTest(dtype=dtype.dtype.name):
        np.testing.assert_array_equal(
            jax.jit(sampling.nonfinite_rows)(jnp.asarray(logits, dtype)),
            expected,
        )

  def test_3d_input(self):
    probs = jax.nn.one_hot(jnp.array([[1, 2], [0, 3]]), 4)
    np.testing.assert_array_equal(
        sampling.sample(jax.random.key(4), probs), [[1, 2], [0, 3]]
    )


if __name__ == "__main__":
  absltest.main()
