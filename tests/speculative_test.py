"""Tests for spec_decode.speculative: the loop, and its counts.

The kernels' own tests are in verify_test.py, the draft's in draft_loop_test.py.
"""

import math

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import fake_models
from spec_decode import decoding
from spec_decode import drafts
from spec_decode import lookup
from spec_decode import sampling
from spec_decode import speculative
from spec_decode.models import t5

GREEDY = sampling.SamplingConfig(temperature=0.0)
VOCAB_SIZE = 16
# Batch sizes of the greedy equality tests (issue 3: 1, 3 and 8).
BATCH_SIZES = (1, 3, 8)
# The T5 loop's: one row, and rows of different input and output lengths.
T5_BATCH_SIZES = (1, 8)


def _fake_draft(model, contexts, capacity):
  return drafts.Draft(model, model.init_cache(contexts, capacity))


def _speculative(
    target, draft, contexts, *, gamma, max_decode_len, config, seed=0
):
  """Runs speculative_decode on fake models; draft is a drafts.Draft."""
  return speculative.speculative_decode(
      target,
      draft.decode_fn,
      target.init_cache(contexts, max_decode_len + gamma + 1),
      draft.cache,
      jax.random.key(seed),
      gamma=gamma,
      max_decode_len=max_decode_len,
      config=config,
  )


def _baseline(target, contexts, *, max_decode_len, config, seed=0):
  return decoding.autoregressive_decode(
      target,
      target.init_cache(contexts, max_decode_len),
      jax.random.key(seed),
      max_decode_len=max_decode_len,
      config=config,
  )


def _check_token_sources(result):
  """The per-token trace agrees with the counts and with itself."""
  sources = np.asarray(result.token_sources)
  rejected = np.asarray(result.rejected_tokens)
  positions = np.arange(sources.shape[1])[None, :]
  live = positions < np.asarray(result.lengths)[:, None]
  np.testing.assert_array_equal(sources[~live], speculative.PADDING)
  np.testing.assert_array_equal(
      np.sum(sources == speculative.ACCEPTED, axis=1), result.accepted_tokens
  )
  # One REPLACEMENT or BONUS per target call, except the last call of a row
  # cut short by EOS or max_decode_len.
  closing = np.sum(sources >= speculative.REPLACEMENT, axis=1)
  calls = np.asarray(result.target_calls)
  np.testing.assert_array_less(calls - 2, closing)
  np.testing.assert_array_less(closing, calls + 1)
  is_replacement = sources == speculative.REPLACEMENT
  np.testing.assert_array_equal(rejected[~is_replacement], -1)
  np.testing.assert_array_less(-1, rejected[is_replacement])
  # A greedy target never replaces a draft with the draft's own token.
  replaced = np.asarray(result.sequences)[is_replacement]
  np.testing.assert_array_less(0, np.abs(replaced - rejected[is_replacement]))


class GreedyTest(parameterized.TestCase):
  """Greedy speculative decoding emits the greedy baseline's tokens."""

  @parameterized.product(
      draft_kind=["other_model", "unigram", "target", "lookup"],
      gamma=[1, 2, 4, 7],
  )
  def test_matches_baseline(self, draft_kind, gamma):
    max_decode_len = 14
    target = fake_models.random_model(0, VOCAB_SIZE, eos_bias=0.5)
    for batch_size in BATCH_SIZES:
      contexts = fake_models.context_ids(batch_size, seed=batch_size)
      capacity = max_decode_len + gamma + 1
      baseline = _baseline(
          target, contexts, max_decode_len=max_decode_len, config=GREEDY
      )
      if draft_kind == "lookup":
        # The input holds the first half of each row's greedy output, the
        # rest being unknown: lookups hit, then miss.
        source = np.where(
            np.arange(max_decode_len) < max_decode_len // 2,
            np.asarray(baseline.sequences),
            0,
        )
        draft = drafts.Draft(
            lookup.PromptLookup(VOCAB_SIZE),
            lookup.init_cache(source, capacity),
        )
      elif draft_kind == "other_model":
        draft = _fake_draft(
            fake_models.perturbed(target, 1, 1.5), contexts, capacity
        )
      elif draft_kind == "unigram":
        corpus = np.random.default_rng(0).integers(0, VOCAB_SIZE, (20, 10))
        draft = drafts.ngram_draft(
            drafts.count_unigrams(corpus, VOCAB_SIZE), batch_size
        )
      else:
        draft = _fake_draft(target, contexts, capacity)
      result = _speculative(
          target,
          draft,
          contexts,
          gamma=gamma,
          max_decode_len=max_decode_len,
          config=GREEDY,
      )
      np.testing.assert_array_equal(result.sequences, baseline.sequences)
      np.testing.assert_array_equal(result.lengths, baseline.lengths)
      if draft_kind == "target":
        np.testing.assert_array_equal(
            result.target_calls, -(-result.lengths // (gamma + 1))
        )
        self.assertEqual(result.acceptance_rate(), 1.0)
      if draft_kind == "lookup":
        self.assertGreater(int(np.sum(result.accepted_tokens)), 0)
    # Rows of the last batch finish at different times.
    self.assertGreater(len(set(np.asarray(result.lengths))), 1)

  def test_bfloat16_logits(self):
    target = fake_models.random_model(0, VOCAB_SIZE, dtype=jnp.bfloat16)
    draft = fake_models.perturbed(target, 1, 1.0)
    contexts = fake_models.context_ids(4)
    result = _speculative(
        target,
        _fake_draft(draft, contexts, 16),
        contexts,
        gamma=3,
        max_decode_len=12,
        config=GREEDY,
    )
    baseline = _baseline(target, contexts, max_decode_len=12, config=GREEDY)
    np.testing.assert_array_equal(result.sequences, baseline.sequences)
    self.assertEqual(result.beta_sum.dtype, jnp.float32)


class T5GreedyTest(parameterized.TestCase):
  """Greedy speculative T5 emits the greedy baseline's tokens, in float32."""

  MAX_DECODE_LEN = 10

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    config = t5.T5Config(
        vocab_size=97,
        emb_dim=16,
        num_heads=4,
        head_dim=8,
        mlp_dim=32,
        num_encoder_layers=2,
        num_decoder_layers=2,
    )
    cls.model = t5.Transformer(config)
    cls.params = t5.init_params(config, jax.random.key(0))
    inputs = np.random.default_rng(0).integers(2, 97, (8, 7))
    inputs[1::2, 4:] = 0  # Rows of different input lengths.
    cls.inputs = {size: inputs[:size] for size in T5_BATCH_SIZES}
    cls.baselines = {}
    for size, rows in cls.inputs.items():
      target = drafts.t5_draft(cls.model, cls.params, rows, cls.MAX_DECODE_LEN)
      cls.baselines[size] = decoding.autoregressive_decode(
          target.decode_fn,
          target.cache,
          jax.random.key(0),
          max_decode_len=cls.MAX_DECODE_LEN,
          config=GREEDY,
      )

  @parameterized.product(
      draft_kind=[
          "smaller_t5",
          "shared_encoder",
          "unigram",
          "target",
          "lookup",
      ],
      gamma=[1, 3, 7],
  )
  def test_matches_baseline(self, draft_kind, gamma):
    for batch_size in T5_BATCH_SIZES:
      with self.subTest(batch_size=batch_size):
        self._check_matches_baseline(draft_kind, gamma, batch_size)

  def _check_matches_baseline(self, draft_kind, gamma, batch_size):
    inputs, baseline = self.inputs[batch_size], self.baselines[batch_size]
    capacity = self.MAX_DECODE_LEN + gamma + 1
    target = drafts.t5_draft(self.model, self.params, inputs, capacity)
    if draft_kind == "smaller_t5":
      config = t5.T5Config(
          vocab_size=97,
          emb_dim=8,
          num_heads=2,
          head_dim=4,
          mlp_dim=16,
          num_encoder_layers=1,
          num_decoder_layers=1,
      )
      draft = drafts.t5_draft(
          t5.Transformer(config),
          t5.init_params(config, jax.random.key(1)),
          inputs,
          capacity,
      )
    elif draft_kind == "shared_encoder":  # Reads the target's encoding.
      config = t5.T5Config(
          vocab_size=97,
          emb_dim=8,
          num_heads=2,
          head_dim=4,
          mlp_dim=16,
          num_encoder_layers=0,
          num_decoder_layers=1,
          shared_encoder_dim=16,
      )
      model = t5.Transformer(config)
      params = t5.init_params(config, jax.random.key(1))
      target_cache, draft_cache = drafts.shared_encoder_caches(
          self.model, self.params, model, params, inputs, capacity
      )
      for mine, theirs in zip(
          jax.tree.leaves(target_cache), jax.tree.leaves(target.cache)
      ):
        np.testing.assert_array_equal(mine, theirs)
      draft = drafts.Draft(t5.make_decode_fn(model, params), draft_cache)
    elif draft_kind == "unigram":  # Counted over the target's own outputs.
      corpus = [
          row[:length]
          for row, length in zip(
              np.asarray(baseline.sequences), baseline.lengths
          )
      ]
      draft = drafts.ngram_draft(drafts.count_unigrams(corpus, 97), batch_size)
    elif draft_kind == "lookup":  # Looks up in the T5's own input.
      draft = drafts.Draft(
          lookup.PromptLookup(97), lookup.init_cache(inputs, capacity)
      )
    else:
      draft = target
    result = speculative.speculative_decode(
        target.decode_fn,
        draft.decode_fn,
        target.cache,
        draft.cache,
        jax.random.key(0),
        gamma=gamma,
        max_decode_len=self.MAX_DECODE_LEN,
        config=GREEDY,
    )
    np.testing.assert_array_equal(result.sequences, baseline.sequences)
    np.testing.assert_array_equal(result.lengths, baseline.lengths)
    _check_token_sources(result)
    if draft_kind == "target":
      np.testing.assert_array_equal(
          result.target_calls, -(-result.lengths // (gamma + 1))
      )
    if draft_kind == "unigram":
      self.assertGreater(int(result.accepted_tokens.sum()), 0)


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
    target = fake_models.random_model(0, VOCAB_SIZE, eos_bias=-np.inf)
    contexts = fake_models.context_ids(3)
    result = _speculative(
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
    target = fake_models.random_model(0, VOCAB_SIZE, eos_bias=-1e9)
    contexts = fake_models.context_ids(3)
    result = _speculative(
        target,
        _fake_draft(fake_models.contrary(target), contexts, 15),
        contexts,
        gamma=4,
        max_decode_len=10,
        config=GREEDY,
    )
    np.testing.assert_array_equal(result.target_calls, 10)
    np.testing.assert_array_equal(result.accepted_tokens, 0)
    np.testing.assert_array_equal(result.drafted_tokens, 10)
    self.assertEqual(result.alpha_estimate(), 0.0)
    baseline = _baseline(target, contexts, max_decode_len=10, config=GREEDY)
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
    target = fake_models.random_model(2, VOCAB_SIZE, eos_bias=0.5)
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
    target = fake_models.random_model(2, VOCAB_SIZE)
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
    target = fake_models.random_model(0, VOCAB_SIZE, eos_bias=2.0)
    contexts = fake_models.context_ids(8)
    result = _speculative(
        target,
        _fake_draft(target, contexts, 20),
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
    target = fake_models.random_model(0, VOCAB_SIZE, eos_bias=-np.inf)
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


class VerifierAndEarlyStopTest(parameterized.TestCase):
  """Both verifiers, with and without early stop, in the whole loop."""

  @parameterized.product(
      verifier=["token", "block"], draft_threshold=[0.0, 0.5, 0.9]
  )
  def test_greedy_matches_baseline(self, verifier, draft_threshold):
    max_decode_len, gamma = 14, 4
    target = fake_models.random_model(0, VOCAB_SIZE, eos_bias=0.5)
    draft_model = fake_models.perturbed(target, 1, 1.5)
    for batch_size in BATCH_SIZES:
      contexts = fake_models.context_ids(batch_size, seed=batch_size)
      capacity = max_decode_len + gamma + 1
      result = speculative.speculative_decode(
          target,
          draft_model,
          target.init_cache(contexts, capacity),
          draft_model.init_cache(contexts, capacity),
          jax.random.key(0),
          gamma=gamma,
          max_decode_len=max_decode_len,
          config=GREEDY,
          verifier=verifier,
          draft_threshold=draft_threshold,
      )
      baseline = _baseline(
          target, contexts, max_decode_len=max_decode_len, config=GREEDY
      )
      np.testing.assert_array_equal(result.sequences, baseline.sequences)
      np.testing.assert_array_equal(result.lengths, baseline.lengths)
      _check_token_sources(result)
      calls = np.asarray(result.draft_calls)
      np.testing.assert_array_less(calls, gamma * result.target_calls + 1)
      if draft_threshold == 0:
        np.testing.assert_array_equal(calls, gamma * result.target_calls)
      elif batch_size == 1 and draft_threshold == 0.9:
        self.assertLess(int(calls[0]), gamma * int(result.target_calls[0]))

  @parameterized.parameters("token", "block")
  def test_early_stop_with_the_target_as_draft(self, verifier):
    # Each call proposes k <= gamma drafts, all accepted, closed by a bonus
    # token; k < gamma happens, and the draft calls count the steps made.
    max_decode_len, gamma = 12, 4
    target = fake_models.random_model(3, VOCAB_SIZE, eos_bias=-np.inf)
    contexts = fake_models.context_ids(1)
    capacity = max_decode_len + gamma + 1
    counter = fake_models.CallCounter(target)
    with jax.disable_jit():
      result = speculative.speculative_decode(
          target,
          counter,
          target.init_cache(contexts, capacity),
          target.init_cache(contexts, capacity),
          jax.random.key(0),
          gamma=gamma,
          max_decode_len=max_decode_len,
          config=sampling.SamplingConfig(),
          verifier=verifier,
          draft_threshold=0.3,
      )
    np.testing.assert_array_equal(result.accepted_tokens, result.drafted_tokens)
    self.assertEqual(counter.calls, int(result.draft_calls[0]))
    self.assertLess(counter.calls, gamma * int(result.target_calls[0]))
    sources = np.asarray(result.token_sources)[0]
    np.testing.assert_array_equal(sources == speculative.REPLACEMENT, False)
    # One bonus token per call, except a last call cut by max_decode_len.
    closing = int(np.sum(sources == speculative.BONUS))
    self.assertIn(int(result.target_calls[0]) - closing, (0, 1))

  def test_block_verifier_is_the_default(self):
    target = fake_models.random_model(0, VOCAB_SIZE)
    draft_model = fake_models.perturbed(target, 1, 1.5)
    contexts = fake_models.context_ids(8)
    results = {}
    for verifier in ("token", "block", None):
      kwargs = {} if verifier is None else dict(verifier=verifier)
      results[verifier] = speculative.speculative_decode(
          target,
          draft_model,
          target.init_cache(contexts, 20),
          draft_model.init_cache(contexts, 20),
          jax.random.key(0),
          gamma=4,
          max_decode_len=15,
          **kwargs,
      )
    np.testing.assert_array_equal(
        results[None].sequences, results["block"].sequences
    )
    self.assertFalse(
        np.array_equal(results[None].sequences, results["token"].sequences)
    )

  @parameterized.named_parameters(
      ("unknown_verifier", dict(verifier="tree"), "verifier"),
      ("threshold_one", dict(draft_threshold=1.0), "draft_threshold"),
      ("negative_threshold", dict(draft_threshold=-0.1), "draft_threshold"),
  )
  def test_invalid_arguments_raise(self, kwargs, name):
    target = fake_models.random_model(0, 4)
    cache = target.init_cache([0], 8)
    with self.assertRaisesRegex(ValueError, f"^{name} must be"):
      speculative.speculative_decode(
          target,
          target,
          cache,
          cache,
          jax.random.key(0),
          gamma=2,
          max_decode_len=4,
          **kwargs,
      )


if __name__ == "__main__":
  absltest.main()
