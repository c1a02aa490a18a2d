"""Speculative sampling has exactly the target's distribution over sequences.

A tiny target (V = 6, at most 3 new tokens) has few enough outcomes to
enumerate: its exact probability of every whole output sequence, EOS and
max_decode_len respected, comes from one batched call on all token triples.
Then 20,000 speculative samples, drawn in one batched call, must pass a
chi-square test and a total-variation bound against it.
"""

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

VOCAB_SIZE = 6
EOS_ID = 1
MAX_DECODE_LEN = 3
NUM_SAMPLES = 20_000
CONTEXT = 7  # Every row decodes the same input, so samples are i.i.d.
# The chi-square tests' level: with 63 cases, a false alarm in 1 suite run of
# 1,600 under the null. (A residual drawn from the target instead of
# max(0, p - q) gives p-values below 1e-30 here.)
CHI_SQUARE_LEVEL = 1e-5
# New tokens of the several-iterations cases (781 outcomes, 222 of them
# expected at least 5 times in NUM_SAMPLES).
LONG_DECODE_LEN = 4

CONFIGS = {
    "temperature_1": sampling.SamplingConfig(),
    "temperature_0_6": sampling.SamplingConfig(temperature=0.6),
    "top_k_3": sampling.SamplingConfig(top_k=3),
    "top_p_0_8": sampling.SamplingConfig(top_p=0.8),
}
# Draft kind -> gamma. The target as draft drafts past the room left. The
# good draft's acceptance rate is 0.73-0.89 here, the bad one's 0.28-0.38.
GAMMAS = {"good": 2, "bad": 1, "target": 4, "lookup": 2}
# The lookup draft's input: it proposes what followed the last token here
# (4 after 5, 5 after 4, ...), one-hot; EOS where nothing did.
LOOKUP_SOURCE = [2, 5, 4, 5, 3, 1]
# "none" runs the baseline decoder, as a control of the enumeration.
DRAFT_KINDS = [*GAMMAS, "none"]
# Verifier cases: the verifier and the draft threshold (early stop). At 0.6
# the good draft stops early in about a third of its blocks, the target as
# draft in a fifth.
VERIFIER_CASES = {
    "token": ("token", 0.0),
    "block": ("block", 0.0),
    "token_early_stop": ("token", 0.6),
    "block_early_stop": ("block", 0.6),
}


def _target():
  return fake_models.random_model(0, VOCAB_SIZE, scale=1.5, eos_bias=-0.5)


def _draft(kind, target, capacity):
  """Returns a drafts.Draft for NUM_SAMPLES rows."""
  contexts = [CONTEXT] * NUM_SAMPLES
  if kind == "good":
    draft = fake_models.perturbed(target, 1, 0.5)
    return drafts.Draft(draft, draft.init_cache(contexts, capacity))
  if kind == "bad":
    # A unigram with no mass on tokens 4 and 5, which the target wants.
    corpus = [[0, 2, 2, 3, 1], [3, 3, 0, 2], [2, 1]]
    return drafts.ngram_draft(
        drafts.count_unigrams(corpus, VOCAB_SIZE), NUM_SAMPLES
    )
  if kind == "lookup":
    return drafts.Draft(
        lookup.PromptLookup(VOCAB_SIZE),
        lookup.init_cache(np.tile(LOOKUP_SOURCE, (NUM_SAMPLES, 1)), capacity),
    )
  return drafts.target_as_draft(target, target.init_cache(contexts, capacity))


def _token_triples(max_decode_len):
  """Every output [V^n, n] and its decoder inputs [BOS, y_1, ..., y_{n-1}]."""
  triples = np.array(
      list(itertools.product(range(VOCAB_SIZE), repeat=max_decode_len))
  )  # [V^n, n], n = max_decode_len
  inputs = np.concatenate(
      [np.full((len(triples), 1), decoding.BOS_ID), triples[:, :-1]], axis=1
  )  # [V^n, n]
  return triples, inputs


def _outcome_probabilities(triples, logits, config):
  """Maps every outcome (the tokens up to EOS) to its exact probability."""
  probs = np.asarray(sampling.logits_to_probs(logits, config), np.float64)
  token_probs = np.take_along_axis(probs, triples[..., None], -1)[..., 0]
  distribution = {}
  for triple, step_probs in zip(triples, token_probs):
    length = triples.shape[1]
    if EOS_ID in triple:
      length = list(triple).index(EOS_ID) + 1
    distribution[tuple(triple[:length])] = np.prod(step_probs[:length])
  return distribution


def _exact_distribution(target, config, max_decode_len=MAX_DECODE_LEN):
  """Maps every outcome (a token tuple) to its exact probability."""
  triples, inputs = _token_triples(max_decode_len)
  logits, _ = target(
      jnp.asarray(inputs),
      target.init_cache([CONTEXT] * len(triples), max_decode_len),
  )
  return _outcome_probabilities(triples, logits, config)


def _tv_bound(distribution, num_samples, failure_probability=1e-6):
  """A bound that the TV of an empirical distribution exceeds w.p. < 1e-6.

  E|p_hat(x) - p(x)| <= sqrt(p(x)(1 - p(x)) / N) by Jensen, which bounds the
  expected TV; and TV moves by at most 1/N when one sample changes, so by
  McDiarmid's inequality it exceeds its mean by t with probability at most
  exp(-2 N t^2). With N = 20,000 the bound is 0.028-0.044 for the
  configurations here (0.019 of it the deviation term), while the expected TV
  under the null is 0.008-0.020 (normal approximation: sqrt(2 / pi) times the
  mean term). So a sampler whose TV from the target exceeds about 0.045 fails
  for sure; the chi-square test on the same samples catches far smaller
  biases. (Sampling the residual from the target instead of max(0, p - q)
  gives TV 0.11-0.28 here; the EasyDeL bug, a batch-wide minimum of accepted
  tokens, gives 0.74-0.80.)

  Args:
    distribution: outcome -> exact probability.
    num_samples: N.
    failure_probability: The chance, under the null, of exceeding the bound.

  Returns:
    The bound.
  """
  probs = np.array(list(distribution.values()))
  mean_bound = 0.5 * np.sum(np.sqrt(probs * (1 - probs) / num_samples))
  deviation = math.sqrt(math.log(1 / failure_probability) / (2 * num_samples))
  return mean_bound + deviation


def _assert_follows(test, result, distribution):
  """The rows of `result` are samples from `distribution` (chi-square, TV).

  Args:
    test: the TestCase.
    result: a decoder's result, its rows i.i.d. samples.
    distribution: outcome -> exact probability.
  """
  num_samples = len(result.lengths)
  test.assertAlmostEqual(sum(distribution.values()), 1.0, places=5)
  counts = dict.fromkeys(distribution, 0)
  lengths = np.asarray(result.lengths)  # Not 20,000 device scalars.
  for row, length in zip(np.asarray(result.sequences), lengths):
    counts[tuple(row[:length])] += 1  # A KeyError is an impossible outcome.
  outcomes = sorted(distribution, key=distribution.get)
  observed = np.array([counts[outcome] for outcome in outcomes])
  expected = num_samples * np.array([distribution[o] for o in outcomes])
  test.assertEqual(observed[expected == 0].sum(), 0)

  # Chi-square, with the outcomes expected fewer than 5 times pooled.
  rare = expected < 5
  observed = np.concatenate([[observed[rare].sum()], observed[~rare]])
  expected = np.concatenate([[expected[rare].sum()], expected[~rare]])
  if expected[0] == 0:
    observed, expected = observed[1:], expected[1:]
  _, p_value = scipy.stats.chisquare(
      observed, expected * (num_samples / expected.sum())
  )
  test.assertGreater(p_value, CHI_SQUARE_LEVEL)

  total_variation = 0.5 * sum(
      abs(counts[o] / num_samples - distribution[o]) for o in distribution
  )
  test.assertLess(total_variation, _tv_bound(distribution, num_samples))


def _early_bonus_tokens(result, gamma):
  """Bonus tokens after fewer than gamma accepted drafts: early stops."""
  sources = np.asarray(result.token_sources)
  run = np.zeros(len(sources), int)  # Accepted drafts before each token.
  count = 0
  for column in sources.T:
    count += np.sum((column == speculative.BONUS) & (run < gamma))
    run = np.where(column == speculative.ACCEPTED, run + 1, 0)
  return count


class LosslessTest(parameterized.TestCase):

  @parameterized.product(
      config_name=list(CONFIGS),
      draft_kind=DRAFT_KINDS,
      verifier_case=list(VERIFIER_CASES),
  )
  def test_samples_follow_the_target_distribution(
      self, config_name, draft_kind, verifier_case
  ):
    if draft_kind == "none" and verifier_case != "token":
      self.skipTest("the baseline has no verifier")
    if draft_kind == "lookup" and VERIFIER_CASES[verifier_case][1]:
      # Its one-hot q never falls below a threshold < 1: the same runs as
      # without early stop.
      self.skipTest("prompt lookup never stops early")
    verifier, draft_threshold = VERIFIER_CASES[verifier_case]
    config = CONFIGS[config_name]
    target = _target()
    rng = jax.random.key(
        list(CONFIGS).index(config_name) * len(DRAFT_KINDS)
        + DRAFT_KINDS.index(draft_kind)
        + 1000 * list(VERIFIER_CASES).index(verifier_case)
    )
    if draft_kind == "none":
      result = decoding.autoregressive_decode(
          target,
          target.init_cache([CONTEXT] * NUM_SAMPLES, MAX_DECODE_LEN),
          rng,
          max_decode_len=MAX_DECODE_LEN,
          eos_id=EOS_ID,
          config=config,
      )
    else:
      gamma = GAMMAS[draft_kind]
      capacity = MAX_DECODE_LEN + gamma + 1
      draft = _draft(draft_kind, target, capacity)
      result = speculative.speculative_decode(
          target,
          draft.decode_fn,
          target.init_cache([CONTEXT] * NUM_SAMPLES, capacity),
          draft.cache,
          rng,
          gamma=gamma,
          max_decode_len=MAX_DECODE_LEN,
          eos_id=EOS_ID,
          config=config,
          verifier=verifier,
          draft_threshold=draft_threshold,
      )
      if draft_threshold and gamma > 1:
        self.assertGreater(_early_bonus_tokens(result, gamma), 0)
      if draft_kind == "lookup":  # A one-hot q, often right.
        self.assertGreater(
            int(np.sum(result.accepted_tokens)), NUM_SAMPLES // 10
        )
    _assert_follows(self, result, _exact_distribution(target, config))


class SharedEncoderDraftTest(parameterized.TestCase):
  """A T5 target and a shared-encoder T5 draft (which reads the target's
  encoding), sampled: the same enumeration, from the T5's teacher-forced
  logits on every token triple."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    target_config = fake_models.tiny_t5(VOCAB_SIZE)
    draft_config = t5.T5Config(
        vocab_size=VOCAB_SIZE,
        emb_dim=8,
        num_heads=2,
        head_dim=4,
        mlp_dim=16,
        num_encoder_layers=0,
        num_decoder_layers=1,
        shared_encoder_dim=16,
    )
    cls.target = t5.Transformer(target_config)
    cls.draft = t5.Transformer(draft_config)
    # Sharper than at init: logits of a few units.
    cls.target_params = jax.tree.map(
        lambda x: 3 * x, t5.init_params(target_config, jax.random.key(0))
    )
    cls.draft_params = jax.tree.map(
        lambda x: 3 * x, t5.init_params(draft_config, jax.random.key(1))
    )

  def _exact_distribution(self, config):
    triples, decoder_inputs = _token_triples(MAX_DECODE_LEN)
    logits = self.target.apply(
        {"params": self.target_params},
        np.tile(self._input(), (len(triples), 1)),
        decoder_inputs,
    )
    return _outcome_probabilities(triples, logits, config)

  def _input(self):
    return np.array([[2, 5, 4, 3, 0]], np.int32)

  @parameterized.parameters("temperature_1", "top_k_3")
  def test_samples_follow_the_target_distribution(self, config_name):
    config = CONFIGS[config_name]
    gamma = 2
    capacity = MAX_DECODE_LEN + gamma + 1
    inputs = np.tile(self._input(), (NUM_SAMPLES, 1))
    target_cache, draft_cache = drafts.shared_encoder_caches(
        self.target,
        self.target_params,
        self.draft,
        self.draft_params,
        inputs,
        capacity,
    )
    result = speculative.speculative_decode(
        t5.make_decode_fn(self.target, self.target_params),
        t5.make_decode_fn(self.draft, self.draft_params),
        target_cache,
        draft_cache,
        jax.random.key(list(CONFIGS).index(config_name)),
        gamma=gamma,
        max_decode_len=MAX_DECODE_LEN,
        eos_id=EOS_ID,
        config=config,
    )
    alpha = np.sum(result.accepted_tokens) / np.sum(result.drafted_tokens)
    self.assertBetween(alpha, 0.2, 0.95)  # Drafts both kept and rejected.
    _assert_follows(self, result, self._exact_distribution(config))


class SeveralIterationsTest(parameterized.TestCase):
  """The target as its own draft over several iterations.

  Every draft is accepted, so each iteration emits gamma drafts and a bonus
  token from p_{gamma+1}, and the next one catches the draft up on it. At
  gamma 1 and 2 and 4 new tokens, a row takes 2 iterations (gamma 1: 2 + 2
  tokens; gamma 2: 3 + 1), unless EOS ends it first.
  """

  @parameterized.parameters(
      ("temperature_1", 1), ("temperature_1", 2), ("top_k_3", 1)
  )
  def test_samples_follow_the_target_distribution(self, config_name, gamma):
    config = CONFIGS[config_name]
    max_decode_len = LONG_DECODE_LEN
    target = _target()
    capacity = max_decode_len + gamma + 1
    draft = _draft("target", target, capacity)
    result = speculative.speculative_decode(
        target,
        draft.decode_fn,
        target.init_cache([CONTEXT] * NUM_SAMPLES, capacity),
        draft.cache,
        jax.random.key(100 + gamma),
        gamma=gamma,
        max_decode_len=max_decode_len,
        eos_id=EOS_ID,
        config=config,
    )
    # Most rows run past one iteration, through a bonus token.
    self.assertGreater(np.mean(np.asarray(result.target_calls) >= 2), 0.3)
    _assert_follows(
        self, result, _exact_distribution(target, config, max_decode_len)
    )


if __name__ == "__main__":
  absltest.main()
