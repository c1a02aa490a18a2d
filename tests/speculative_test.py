"""Tests for spec_decode.speculative: the kernel, the loop, and its counts."""

import collections
import itertools
import math

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

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
# The chi-square tests' level (a false alarm in 1 run of 10,000 per test).
CHI_SQUARE_LEVEL = 1e-4


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


class KernelTest(parameterized.TestCase):

  def test_worked_example_of_the_docstring(self):
    draft_probs = jnp.array([[[0.1, 0.2, 0.5, 0.2], [0.1, 0.4, 0.3, 0.2]]])
    target_probs = jnp.array([[[0.1, 0.1, 0.6, 0.2], [0.3, 0.1, 0.3, 0.3]]])
    draft_tokens = jnp.array([[2, 1]])
    take = lambda probs: jnp.take_along_axis(
        probs, draft_tokens[..., None], axis=-1
    )[..., 0]
    num_accepted = speculative.accepted_count(
        jnp.array([[0.9, 0.5]]), take(target_probs), take(draft_probs)
    )
    np.testing.assert_array_equal(num_accepted, [1])
    residual = speculative.residual_probs(target_probs[0, 1], draft_probs[0, 1])
    np.testing.assert_allclose(residual, [0.2, 0, 0, 0.1], atol=1e-7)
    np.testing.assert_allclose(
        residual / residual.sum(), [2 / 3, 0, 0, 1 / 3], rtol=1e-6
    )

  def test_draft_probability_zero_needs_no_special_case(self):
    # r * 0 < p accepts exactly when p > 0, and nothing divides by zero.
    num_accepted = speculative.accepted_count(
        jnp.array([[0.0, 0.99], [0.5, 0.0]]),
        jnp.array([[0.2, 0.1], [0.0, 0.3]]),
        jnp.array([[0.0, 0.0], [0.0, 0.0]]),
    )
    np.testing.assert_array_equal(num_accepted, [2, 0])

  def test_residual_of_equal_distributions_falls_back_to_the_target(self):
    target_probs = jnp.array([[0.25, 0.5, 0.25, 0.0]])
    residual = speculative.residual_probs(target_probs, target_probs)
    np.testing.assert_array_equal(residual, target_probs)
    tokens = sampling.sample(
        jax.random.key(0), jnp.broadcast_to(residual, (1000, 4))
    )
    self.assertEqual(np.bincount(tokens, minlength=4)[3], 0)

  @parameterized.named_parameters(
      ("generic", [0.1, 0.2, 0.3, 0.4, 0.0], [0.3, 0.3, 0.1, 0.1, 0.2]),
      ("draft_misses_tokens", [0.1, 0.2, 0.3, 0.4, 0.0], [0.5, 0.5, 0, 0, 0]),
      ("equal", [0.1, 0.2, 0.3, 0.4, 0.0], [0.1, 0.2, 0.3, 0.4, 0.0]),
      ("one_hot_target", [0, 0, 1, 0, 0], [0.2, 0.2, 0.2, 0.2, 0.2]),
      ("disjoint", [0.5, 0.5, 0, 0, 0], [0, 0, 0, 0.5, 0.5]),
  )
  def test_emitted_token_has_the_target_distribution(
      self, target_probs, draft_probs
  ):
    target_probs = np.array(target_probs, np.float32)
    draft_probs = np.array(draft_probs, np.float32)

    # Exactly: P(y) = q(y) min(1, p(y) / q(y)) + P(reject) residual(y)
    #               = min(p(y), q(y)) + (1 - sum_x min(p, q)) residual(y).
    overlap = np.minimum(target_probs, draft_probs)
    residual = np.asarray(speculative.residual_probs(target_probs, draft_probs))
    emitted = overlap + (1 - overlap.sum()) * residual / residual.sum()
    np.testing.assert_allclose(emitted, target_probs, atol=1e-7)

    # By sampling, with gamma = 1: the first emitted token is x_1 when it is
    # accepted, the residual's token otherwise.
    num_rows = 100_000
    draft_tokens = sampling.sample(
        jax.random.key(1), jnp.broadcast_to(draft_probs, (num_rows, 5))
    )[
        :, None
    ]  # [B, 1]
    num_accepted, next_tokens, _ = speculative.verify(
        jax.random.key(2),
        jax.random.key(3),
        jnp.broadcast_to(target_probs, (num_rows, 2, 5)),
        jnp.broadcast_to(draft_probs, (num_rows, 1, 5)),
        draft_tokens,
    )
    tokens = np.where(num_accepted == 1, draft_tokens[:, 0], next_tokens)
    counts = np.bincount(tokens, minlength=5)
    support = target_probs > 0
    np.testing.assert_array_equal(counts[~support], 0)
    if support.sum() > 1:
      expected = target_probs[support].astype(np.float64)
      _, p_value = scipy.stats.chisquare(
          counts[support], num_rows * expected / expected.sum()
      )
      self.assertGreater(p_value, 1e-3)


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


def _block_law(target_probs, draft_probs):
  """The exact law of the block one verify call emits, for fixed p and q.

  With drafts x_i ~ q_i drawn independently and p_i fixed per position, the
  block (t_1..t_k) is emitted with probability
    prod_{i<k} min(p_i, q_i)(t_i) * max(0, p_k - q_k)(t_k)   for k <= gamma,
    prod_{i<=gamma} min(p_i, q_i)(t_i) * p_{gamma+1}(t_k)    for k = gamma + 1,
  since a rejection at k has probability 1 - beta_k and the residual is
  max(0, p_k - q_k) / (1 - beta_k).

  Args:
    target_probs: float64 [gamma + 1, V].
    draft_probs: float64 [gamma, V].

  Returns:
    Maps each block (a token tuple) to its probability.
  """
  gamma, vocab_size = draft_probs.shape
  overlap = np.minimum(target_probs[:-1], draft_probs)  # [gamma, V]
  closing = np.concatenate(
      [target_probs[:-1] - overlap, target_probs[-1:]]
  )  # [gamma + 1, V]
  law = {}
  for k in range(1, gamma + 2):
    for block in itertools.product(range(vocab_size), repeat=k):
      prefix = np.prod([overlap[i, t] for i, t in enumerate(block[:-1])])
      law[block] = prefix * closing[k - 1, block[-1]]
  return law


class BlockLawTest(parameterized.TestCase):
  """The law of the whole emitted block, bonus token included.

  gamma 2 and 3, a different p and q at every position (q with a zero where
  p is not), 200,000 rows in one `verify` call; the block counts must fit the
  closed-form law of `_block_law` (chi-square at CHI_SQUARE_LEVEL), and that
  law must marginalize to independent draws from p_1, p_2, ...
  """

  NUM_ROWS = 200_000
  VOCAB = 4

  def _probs(self, gamma, seed):
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.ones(self.VOCAB), gamma + 1)  # [gamma + 1, V]
    draft = rng.dirichlet(np.ones(self.VOCAB), gamma)  # [gamma, V]
    draft[0, 3] = 0.0  # The draft misses a token the target wants.
    draft[0] /= draft[0].sum()
    return target.astype(np.float32), draft.astype(np.float32)

  @parameterized.parameters((2, 0), (3, 1))
  def test_closed_form_law_emits_independent_target_draws(self, gamma, seed):
    target, draft = self._probs(gamma, seed)
    law = _block_law(target.astype(np.float64), draft.astype(np.float64))
    self.assertAlmostEqual(sum(law.values()), 1.0, places=6)
    # The first tokens of a block, emitted or not yet: P(block starts with t)
    # summed over the longer blocks equals prod_i p_i(t_i).
    for block in itertools.product(range(self.VOCAB), repeat=2):
      starts = sum(v for b, v in law.items() if b[:2] == block)
      starts += law.get(block[:1], 0) * target[1, block[1]]  # Next call.
      self.assertAlmostEqual(
          starts, target[0, block[0]] * target[1, block[1]], places=6
      )

  @parameterized.parameters((2, 0), (3, 1))
  def test_emitted_blocks_follow_the_closed_form_law(self, gamma, seed):
    target, draft = self._probs(gamma, seed)
    draft_rng, coin_rng, residual_rng = jax.random.split(
        jax.random.key(seed), 3
    )
    draft_tokens = jax.vmap(
        lambda key, probs: sampling.sample(
            key, jnp.broadcast_to(probs, (self.NUM_ROWS, self.VOCAB))
        ),
        out_axes=1,
    )(
        jax.random.split(draft_rng, gamma), jnp.asarray(draft)
    )  # [N, gamma]
    num_accepted, next_tokens, _ = speculative.verify(
        coin_rng,
        residual_rng,
        jnp.broadcast_to(target, (self.NUM_ROWS, gamma + 1, self.VOCAB)),
        jnp.broadcast_to(draft, (self.NUM_ROWS, gamma, self.VOCAB)),
        draft_tokens,
    )
    counts = collections.Counter(
        tuple(row[:n]) + (y,)
        for row, n, y in zip(
            np.asarray(draft_tokens).tolist(),
            np.asarray(num_accepted).tolist(),
            np.asarray(next_tokens).tolist(),
        )
    )
    law = _block_law(target.astype(np.float64), draft.astype(np.float64))
    impossible = [b for b in counts if law.get(b, 0.0) == 0.0]
    self.assertEqual(impossible, [])
    self.assertGreater(
        sum(c for b, c in counts.items() if len(b) == gamma + 1), 5000
    )
    blocks = sorted((b for b in law if law[b] > 0), key=law.get)
    observed = np.array([counts[b] for b in blocks], np.float64)
    expected = self.NUM_ROWS * np.array([law[b] for b in blocks])
    rare = np.cumsum(expected) < 5  # Pooled until each cell expects 5.
    observed = np.concatenate([[observed[rare].sum()], observed[~rare]])
    expected = np.concatenate([[expected[rare].sum()], expected[~rare]])
    if expected[0] == 0:
      observed, expected = observed[1:], expected[1:]
    _, p_value = scipy.stats.chisquare(
        observed, expected * (self.NUM_ROWS / expected.sum())
    )
    self.assertGreater(p_value, CHI_SQUARE_LEVEL)


class DraftCatchUpTest(parameterized.TestCase):
  """The draft cache after the loop holds the emitted history, at any gamma.

  At gamma 1 the draft makes one call per iteration, the 2-token catch-up,
  and nothing in the loop reads its cache afterwards; only the returned
  cache shows whether the catch-up advanced it. With the target as draft and
  no EOS, every row emits gamma + 1 tokens per iteration and all rows end in
  the same iteration, which starts at length n - (gamma + 1): the catch-up
  writes up to there and the gamma - 1 draft steps add gamma - 1 positions.
  """

  @parameterized.parameters(1, 2)
  def test_returned_draft_cache_holds_the_history(self, gamma):
    max_decode_len = 4 * (gamma + 1)
    target = fake_models.random_model(0, VOCAB_SIZE, eos_bias=-np.inf)
    contexts = fake_models.context_ids(3)
    capacity = max_decode_len + gamma + 1
    draft = fake_models.perturbed(target, 0, 0.0)  # The target, a copy.
    result, _, draft_cache = speculative.speculative_decode(
        target,
        draft,
        target.init_cache(contexts, capacity),
        draft.init_cache(contexts, capacity),
        jax.random.key(0),
        gamma=gamma,
        max_decode_len=max_decode_len,
        config=sampling.SamplingConfig(),
        return_caches=True,
    )
    np.testing.assert_array_equal(result.lengths, max_decode_len)
    last_start = max_decode_len - (gamma + 1)
    np.testing.assert_array_equal(draft_cache.lengths, last_start + gamma)
    # A fresh pass over [BOS, y_1..y_n] gives the hash of every prefix.
    history = np.concatenate(
        [np.zeros((3, 1), np.int32), np.asarray(result.sequences)], axis=1
    )
    _, fresh = target(jnp.asarray(history), target.init_cache(contexts, 99))
    written = last_start + 1  # Through the catch-up's second token.
    np.testing.assert_array_equal(
        np.asarray(draft_cache.prefix_hashes)[:, :written],
        np.asarray(fresh.prefix_hashes)[:, :written],
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
