"""Tests for spec_decode.speculative: what the loop counts and what it calls.

Target calls, drafted and accepted tokens, the alpha estimates and the
per-token trace (`CountingTest`), the model calls and cache bounds, and the
PRNG calls of an iteration (`PrngCallsTest`).

The greedy equality tests are in speculative_greedy_test.py, the verifiers'
and early stop's in speculative_verifiers_test.py; the runs they share are in
loop_runs.py.
"""

import math

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

import fake_models
import loop_runs
from spec_decode import drafts
from spec_decode import sampling
from spec_decode import speculative


class CountingTest(parameterized.TestCase):
  """Target calls, drafted and accepted tokens, and the alpha estimates.

  No target step precedes the loop: the first target call is the first
  iteration's verify call on [BOS, x_1..x_gamma]. So with the target as its
  own draft, every call emits gamma + 1 tokens, and n tokens take exactly
  ceil(n / (gamma + 1)) target calls.
  """

  @parameterized.parameters(1, 2, 4, 7)
  def test_target_as_draft_takes_ceil_n_over_gamma_plus_1_calls(self, gamma):
    max_decode_len = 10
    target = fake_models.random_model(0, loop_runs.VOCAB_SIZE, eos_bias=-np.inf)
    contexts = fake_models.context_ids(3)
    result = loop_runs.run_speculative(
        target,
        drafts.target_as_draft(
            target, target.init_cache(contexts, max_decode_len + gamma + 1)
        ),
        contexts,
        gamma=gamma,
        max_decode_len=max_decode_len,
        config=sampling.SamplingConfig(),
    )
    np.testing.assert_array_equal(result.lengths, max_decode_len)
    np.testing.assert_array_equal(
        result.target_calls, math.ceil(max_decode_len / (gamma + 1))
    )
    self.assertEqual(result.acceptance_rate(), 1.0)
    self.assertAlmostEqual(float(result.alpha_estimate()), 1.0, places=6)
    # Blocks of gamma accepted drafts, each closed by a bonus token; the
    # last block is cut by max_decode_len.
    block = [speculative.ACCEPTED] * gamma + [speculative.BONUS]
    expected = (block * max_decode_len)[:max_decode_len]
    np.testing.assert_array_equal(result.token_sources, [expected] * 3)
    np.testing.assert_array_equal(result.rejected_tokens, -1)

  def test_contrary_draft_emits_one_token_per_call(self):
    target = fake_models.random_model(0, loop_runs.VOCAB_SIZE, eos_bias=-1e9)
    contexts = fake_models.context_ids(3)
    result = loop_runs.run_speculative(
        target,
        loop_runs.fake_draft(fake_models.contrary(target), contexts, 15),
        contexts,
        gamma=4,
        max_decode_len=10,
        config=loop_runs.GREEDY,
    )
    np.testing.assert_array_equal(result.target_calls, 10)
    np.testing.assert_array_equal(result.accepted_tokens, 0)
    np.testing.assert_array_equal(result.drafted_tokens, 10)
    self.assertEqual(result.alpha_estimate(), 0.0)
    baseline = loop_runs.run_baseline(
        target, contexts, max_decode_len=10, config=loop_runs.GREEDY
    )
    np.testing.assert_array_equal(result.sequences, baseline.sequences)
    # Every token replaces a rejected draft: the draft's first choice, its
    # target's last choice, which is never the emitted token.
    np.testing.assert_array_equal(result.token_sources, speculative.REPLACEMENT)
    rejected = np.asarray(result.rejected_tokens)
    self.assertTrue(np.all(rejected >= 0))
    self.assertFalse(np.any(rejected == np.asarray(result.sequences)))

  @parameterized.named_parameters(
      ("target_as_draft", 3, 10, True),
      ("gamma_beyond_the_room_left", 7, 3, False),
  )
  def test_model_calls_and_cache_bounds_without_jit(
      self, gamma, max_decode_len, draft_is_target
  ):
    target = fake_models.random_model(2, loop_runs.VOCAB_SIZE, eos_bias=0.5)
    contexts = fake_models.context_ids(3, seed=5)
    capacity = max_decode_len + gamma + 1
    draft_model = (
        target if draft_is_target else fake_models.perturbed(target, 1, 1.0)
    )
    target_counter = fake_models.CallCounter(target)
    draft_counter = fake_models.CallCounter(draft_model)
    with jax.disable_jit():
      result = speculative.speculative_decode(
          target_counter,
          draft_counter,
          target.init_cache(contexts, capacity),
          draft_model.init_cache(contexts, capacity),
          jax.random.key(0),
          gamma=gamma,
          max_decode_len=max_decode_len,
          config=sampling.SamplingConfig(),
      )
    # The batch calls the target until its last row is done.
    self.assertEqual(target_counter.calls, int(result.target_calls.max()))
    self.assertEqual(draft_counter.calls, gamma * target_counter.calls)
    self.assertLessEqual(target_counter.max_end, capacity)
    self.assertLessEqual(draft_counter.max_end, capacity)
    if draft_is_target:
      np.testing.assert_array_equal(
          result.target_calls, -(-result.lengths // (gamma + 1))
      )
      # Rows finish apart, so done rows run along within the capacity.
      self.assertGreater(len(set(np.asarray(result.lengths))), 1)

  @parameterized.parameters((0.0, 4), (0.5, 2))
  def test_draft_steps_unrolled_unless_they_can_stop_early(
      self, draft_threshold, traced_calls
  ):
    # Traced draft calls: gamma unrolled, or the first and a loop body.
    target = fake_models.random_model(2, loop_runs.VOCAB_SIZE)
    contexts = fake_models.context_ids(2, seed=5)
    cache = target.init_cache(contexts, 12)
    calls = []

    def draft_fn(tokens, draft_cache):
      calls.append(tokens.shape)
      return target(tokens, draft_cache)

    jax.jit(
        lambda target_cache, draft_cache: speculative.speculative_decode(
            target,
            draft_fn,
            target_cache,
            draft_cache,
            jax.random.key(0),
            gamma=4,
            max_decode_len=7,
            config=sampling.SamplingConfig(),
            draft_threshold=draft_threshold,
        ).sequences
    ).lower(cache, cache)
    self.assertLen(calls, traced_calls)

  def test_eos_accepted_mid_block_ends_the_row(self):
    target = fake_models.random_model(0, loop_runs.VOCAB_SIZE, eos_bias=2.0)
    contexts = fake_models.context_ids(8)
    result = loop_runs.run_speculative(
        target,
        loop_runs.fake_draft(target, contexts, 20),
        contexts,
        gamma=7,
        max_decode_len=12,
        config=sampling.SamplingConfig(),
    )
    sequences = np.asarray(result.sequences)
    lengths = np.asarray(result.lengths)
    ended_early = lengths < 12
    self.assertGreaterEqual(ended_early.sum(), 2)
    for row, length in zip(sequences, lengths):
      self.assertNotIn(1, row[: length - 1])
      np.testing.assert_array_equal(row[length:], 0)
    np.testing.assert_array_equal(
        sequences[ended_early, lengths[ended_early] - 1], 1
    )
    np.testing.assert_array_equal(result.target_calls, -(-lengths // 8))
    np.testing.assert_array_equal(result.accepted_tokens, result.drafted_tokens)

  @parameterized.named_parameters(
      ("zero_gamma", dict(gamma=0), "gamma"),
      ("float_gamma", dict(gamma=2.0), "gamma"),
      ("bool_gamma", dict(gamma=True), "gamma"),
      ("bool_threshold", dict(draft_threshold=False), "draft_threshold"),
      ("zero_length", dict(max_decode_len=0), "max_decode_len"),
  )
  def test_invalid_arguments_raise(self, kwargs, name):
    target = fake_models.random_model(0, 4)
    cache = target.init_cache([0], 8)
    kwargs = dict(dict(gamma=2, max_decode_len=4), **kwargs)
    with self.assertRaisesRegex(ValueError, f"^{name} must be"):
      speculative.speculative_decode(
          target, target, cache, cache, jax.random.key(0), **kwargs
      )


class CapacityTest(parameterized.TestCase):
  """Both caches hold every position the last target call writes."""

  @parameterized.parameters("target_cache", "draft_cache")
  def test_a_cache_one_position_short_is_refused(self, name):
    model = fake_models.random_model(0, 4)
    caches = {
        "target_cache": fake_models.abstract_t5_cache(16),
        "draft_cache": fake_models.abstract_t5_cache(16),
    }
    caches[name] = fake_models.abstract_t5_cache(15)
    with self.assertRaisesRegex(
        ValueError,
        f"^{name} holds 15 decoder positions; max_decode_len 12 and gamma 3 "
        r"\(drafts.speculative_capacity\) need 16.$",
    ):
      speculative.speculative_decode(
          model,
          model,
          **caches,
          decode_rng=jax.random.key(0),
          gamma=3,
          max_decode_len=12,
      )


def _count_primitives(jaxpr, names):
  """Equations of `jaxpr` and of every jaxpr inside it whose primitive is
  one of `names`."""
  count = 0
  for eqn in jaxpr.eqns:
    count += eqn.primitive.name in names
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          count += _count_primitives(sub.jaxpr, names)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          count += _count_primitives(sub, names)
  return count


class PrngCallsTest(absltest.TestCase):
  """An iteration's random numbers come from a fixed few PRNG calls, however
  many drafts it makes (`sampling.draw_uniforms`)."""

  def test_prng_calls_do_not_grow_with_gamma(self):
    target = fake_models.random_model(0, loop_runs.VOCAB_SIZE, eos_bias=-np.inf)
    draft = fake_models.perturbed(target, 1, 0.5)
    contexts = fake_models.context_ids(2)
    calls = {}
    for gamma in (2, 6):
      jaxpr = jax.make_jaxpr(
          lambda: speculative.speculative_decode(
              target,
              draft,
              target.init_cache(contexts, 20),
              draft.init_cache(contexts, 20),
              jax.random.key(0),
              gamma=gamma,
              max_decode_len=10,
              config=sampling.SamplingConfig(temperature=1.0),
          )
      )()
      calls[gamma] = _count_primitives(
          jaxpr.jaxpr, ("random_bits", "random_fold_in", "random_split")
      )
    # Keys folded per iteration and per stream (4); the drafts' uniforms,
    # the coins and the residual draw (3).
    self.assertEqual(calls, {2: 7, 6: 7})


class CompiledOnceTest(absltest.TestCase):
  """The temperature, top_p and draft threshold are traced
  (`sampling.SamplingConfig` and `draft_loop.Threshold` are pytrees): one
  compiled loop serves all their values, and a loop compiled at one samples
  at another exactly as a loop compiled for it does."""

  def test_one_loop_for_every_temperature_and_top_p(self):
    target = fake_models.random_model(0, loop_runs.VOCAB_SIZE)
    draft = fake_models.perturbed(target, 1, 0.5)
    contexts = fake_models.context_ids(6)

    def decode(temperature, top_p):
      return loop_runs.run_speculative(
          target,
          drafts.Draft(draft, draft.init_cache(contexts, 12)),
          contexts,
          gamma=3,
          max_decode_len=8,
          config=sampling.SamplingConfig(temperature, top_p=top_p),
      ).sequences

    jax.clear_caches()
    alone = decode(0.5, 0.9)
    jax.clear_caches()
    decode(1.4, 0.6)
    after_another = decode(0.5, 0.9)
    np.testing.assert_array_equal(after_another, alone)
    self.assertFalse(np.array_equal(decode(1.4, 0.6), alone))
    self.assertEqual(speculative._speculative_decode._cache_size(), 1)  # pylint: disable=protected-access

  def test_one_loop_for_every_draft_threshold_above_0(self):
    target = fake_models.random_model(0, loop_runs.VOCAB_SIZE)
    draft = fake_models.perturbed(target, 1, 0.5)
    contexts = fake_models.context_ids(6)

    def decode(threshold):
      result = loop_runs.run_speculative(
          target,
          drafts.Draft(draft, draft.init_cache(contexts, 12)),
          contexts,
          gamma=3,
          max_decode_len=8,
          config=sampling.SamplingConfig(),
          draft_threshold=threshold,
      )
      return result.sequences, result.draft_calls

    jax.clear_caches()
    alone = decode(0.4)
    jax.clear_caches()
    other = decode(0.7)
    after_another = decode(0.4)
    np.testing.assert_array_equal(after_another[0], alone[0])
    np.testing.assert_array_equal(after_another[1], alone[1])
    # The two thresholds stop the draft at different places: the test tells
    # them apart.
    self.assertFalse(np.array_equal(other[1], alone[1]))
    self.assertEqual(speculative._speculative_decode._cache_size(), 1)  # pylint: disable=protected-access


if __name__ == "__main__":
  absltest.main()
