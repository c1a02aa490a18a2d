"""Tests for spec_decode.acceptance: hand-built traces, then real runs."""

import itertools
import math

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

import fake_models
from spec_decode import acceptance
from spec_decode import sampling
from spec_decode import speculative

A = speculative.ACCEPTED
R = speculative.REPLACEMENT
B = speculative.BONUS
REJ = acceptance.REJECTED
GAMMA = 3
VOCAB_SIZE = 16

# Two rows, gamma 3, max_decode_len 12 (EOS is 1). Row 0 has four blocks:
# [5, 6] accepted, 9 rejected, 7 drawn in its place; [8, 5, 4] accepted, 3
# the bonus token; nothing accepted, 4 rejected, 6 in its place; [2, 1]
# accepted, cut by the EOS. Row 1: [4] accepted, 5 rejected, the EOS in its
# place.
SEQUENCES = np.array(
    [
        [5, 6, 7, 8, 5, 4, 3, 6, 2, 1, 0, 0],
        [4, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    ]
)
SOURCES = np.array(
    [
        [A, A, R, A, A, A, B, R, A, A, 0, 0],
        [A, R, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    ]
)
REJECTED_TOKENS = np.array(
    [
        [-1, -1, 9, -1, -1, -1, -1, 4, -1, -1, -1, -1],
        [-1, 5, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1],
    ]
)
BLOCKS = [
    [
        acceptance.Block((5, 6), 9, 7, R),
        acceptance.Block((8, 5, 4), None, 3, B),
        acceptance.Block((), 4, 6, R),
        acceptance.Block((2, 1), None, None, speculative.PADDING),
    ],
    [acceptance.Block((4,), 5, 1, R)],
]


def _hand_built_result(beta_sum=(6.0, 1.5)):
  return speculative.SpeculativeResult(
      sequences=SEQUENCES,
      lengths=np.array([10, 2]),
      target_calls=np.array([4, 1]),
      drafted_tokens=np.array([9, 2]),
      accepted_tokens=np.array([7, 1]),
      beta_sum=np.array(beta_sum, np.float32),
      token_sources=SOURCES,
      rejected_tokens=REJECTED_TOKENS,
      draft_calls=np.array([12, 3]),
  )


class HandBuiltTraceTest(absltest.TestCase):

  def test_blocks(self):
    self.assertEqual(acceptance.result_blocks(_hand_built_result()), BLOCKS)
    self.assertEqual(BLOCKS[0][0].judged, (5, 6, 9))
    self.assertEqual(BLOCKS[0][1].judged, (8, 5, 4))

  def test_block_table(self):
    tokens, kinds = acceptance.block_table(BLOCKS[0], GAMMA)
    np.testing.assert_array_equal(
        tokens, [[5, 6, 9, 7], [8, 5, 4, 3], [4, -1, -1, 6], [2, 1, -1, -1]]
    )
    np.testing.assert_array_equal(
        kinds, [[A, A, REJ, R], [A, A, A, B], [REJ, 0, 0, R], [A, A, 0, 0]]
    )

  def test_rates_by_position(self):
    rates = acceptance.rates_by_position(
        itertools.chain.from_iterable(BLOCKS), GAMMA
    )
    np.testing.assert_array_equal(rates.accepted, [4, 3, 1])
    np.testing.assert_array_equal(rates.judged, [5, 4, 2])
    np.testing.assert_array_equal(rates.rate, [0.8, 0.75, 0.5])

  def test_rates_by_frequency(self):
    corpus = [[5, 5, 5, 6, 1], [5, 6, 7, 1], [8, 2]]
    counts = acceptance.token_counts(corpus, 10)
    np.testing.assert_array_equal(counts, [0, 2, 1, 0, 0, 4, 2, 1, 1, 0])
    rates = acceptance.rates_by_frequency(
        itertools.chain.from_iterable(BLOCKS), counts, [0, 1, 2, 4, np.inf]
    )
    # Count 0: 9 and 4 rejected, 4 accepted twice. Count 1: 8 and 2, both
    # accepted. Counts 2-3: 6 and the EOS, accepted. Count 4: 5 accepted
    # twice and rejected once.
    np.testing.assert_array_equal(rates.accepted, [2, 2, 2, 2])
    np.testing.assert_array_equal(rates.judged, [4, 2, 2, 3])
    np.testing.assert_array_equal(rates.rate, [0.5, 1, 1, 2 / 3])

  def test_groups_nothing_was_drafted_in_have_rate_nan(self):
    rates = acceptance.rates_by_frequency(
        BLOCKS[1], np.arange(10), [0, 4, 6, 10]
    )
    np.testing.assert_array_equal(rates.judged, [0, 2, 0])
    np.testing.assert_array_equal(rates.rate, [np.nan, 0.5, np.nan])

  def test_alpha_comparison(self):
    result = _hand_built_result()
    comparison = acceptance.alpha_comparison([result, result])
    self.assertEqual(comparison, acceptance.AlphaComparison(16, 22, 15.0))
    self.assertEqual(comparison.empirical, 16 / 22)
    self.assertEqual(comparison.estimate, 15 / 22)
    self.assertAlmostEqual(
        comparison.std_bound, math.sqrt(15 - 15**2 / 22) / 22, places=15
    )

  def test_std_bound_is_zero_when_every_beta_is_one(self):
    comparison = acceptance.AlphaComparison(5, 5, 5.0)
    self.assertEqual(comparison.std_bound, 0.0)

  def test_malformed_traces_raise(self):
    with self.assertRaisesRegex(ValueError, "Unknown token source 7"):
      acceptance.row_blocks([3, 4], [A, 7], [-1, -1])
    with self.assertRaisesRegex(ValueError, "after PADDING"):
      acceptance.row_blocks([3, 0, 4], [A, 0, B], [-1, -1, -1])
    with self.assertRaisesRegex(ValueError, "more than gamma=2"):
      acceptance.rates_by_position(BLOCKS[0], 2)
    with self.assertRaisesRegex(ValueError, "more than gamma=2"):
      acceptance.block_table(BLOCKS[0], 2)
    with self.assertRaisesRegex(ValueError, "outside the edges"):
      acceptance.rates_by_frequency(BLOCKS[1], np.arange(10), [0, 5])
    with self.assertRaisesRegex(ValueError, "increasing"):
      acceptance.rates_by_frequency(BLOCKS[1], np.arange(10), [0, 5, 5])
    with self.assertRaisesRegex(ValueError, r"outside \[0, 10\)"):
      acceptance.token_counts([[3, 10]], 10)


def _decode(draft_kind, config, *, batch_size=16, max_decode_len=24):
  target = fake_models.random_model(0, VOCAB_SIZE, eos_bias=-1.0)
  draft = (
      target
      if draft_kind == "target"
      else fake_models.perturbed(target, 1, 1.5)
  )
  contexts = fake_models.context_ids(batch_size)
  capacity = max_decode_len + GAMMA + 1
  return speculative.speculative_decode(
      target,
      draft,
      target.init_cache(contexts, capacity),
      draft.init_cache(contexts, capacity),
      jax.random.key(0),
      gamma=GAMMA,
      max_decode_len=max_decode_len,
      config=config,
  )


class RealRunTest(parameterized.TestCase):
  """Blocks and rates of speculative runs agree with the run's own counts."""

  @parameterized.named_parameters(
      ("greedy", sampling.SamplingConfig(temperature=0.0)),
      ("temperature_1", sampling.SamplingConfig(temperature=1.0)),
  )
  def test_blocks_and_rates_match_the_counts(self, config):
    result = jax.device_get(_decode("perturbed", config))
    rows = acceptance.result_blocks(result)
    for row, blocks in enumerate(rows):
      length = int(result.lengths[row])
      self.assertLen(blocks, int(result.target_calls[row]))
      emitted = [
          token
          for block in blocks
          for token in block.accepted
          + ((block.next_token,) if block.next_token is not None else ())
      ]
      np.testing.assert_array_equal(emitted, result.sequences[row, :length])
      # Only a row's last block is cut, by EOS or max_decode_len.
      for block in blocks[:-1]:
        self.assertIsNotNone(block.next_token)
      if blocks[-1].next_token is None:
        self.assertTrue(emitted[-1] == 1 or length == 24)
    blocks = list(itertools.chain.from_iterable(rows))
    self.assertTrue(any(block.next_source == B for block in blocks))
    self.assertTrue(any(block.next_source == R for block in blocks))
    by_position = acceptance.rates_by_position(blocks, GAMMA)
    counts = acceptance.token_counts(
        [row[:length] for row, length in zip(result.sequences, result.lengths)],
        VOCAB_SIZE,
    )
    by_frequency = acceptance.rates_by_frequency(
        blocks, counts, [0, 1, 8, 32, np.inf]
    )
    comparison = acceptance.alpha_comparison([result])
    for rates in (by_position, by_frequency):
      self.assertEqual(rates.accepted.sum(), result.accepted_tokens.sum())
      self.assertEqual(rates.judged.sum(), result.drafted_tokens.sum())
    self.assertEqual(comparison.accepted, result.accepted_tokens.sum())
    self.assertEqual(comparison.judged, result.drafted_tokens.sum())
    self.assertAlmostEqual(
        comparison.empirical, float(result.acceptance_rate()), places=6
    )
    self.assertAlmostEqual(
        comparison.estimate, float(result.alpha_estimate()), places=6
    )
    # A draft is judged only after the drafts before it were accepted.
    np.testing.assert_array_less(
        by_position.judged[1:], by_position.accepted[:-1] + 1
    )
    if config.greedy:
      self.assertEqual(comparison.estimate, comparison.empirical)
      # A greedy target never replaces a draft by the draft's own token.
      for block in blocks:
        if block.rejected is not None:
          self.assertNotEqual(block.rejected, block.next_token)
    else:
      self.assertGreater(comparison.judged, 200)
      self.assertLess(
          abs(comparison.empirical - comparison.estimate),
          4 * comparison.std_bound,
      )

  def test_target_as_draft_accepts_every_position(self):
    result = jax.device_get(_decode("target", sampling.SamplingConfig()))
    rows = acceptance.result_blocks(result)
    for blocks in rows:
      for block in blocks[:-1]:
        self.assertEqual(len(block.accepted), GAMMA)
        self.assertEqual(block.next_source, B)
    rates = acceptance.rates_by_position(
        itertools.chain.from_iterable(rows), GAMMA
    )
    np.testing.assert_array_equal(rates.rate, [1, 1, 1])
    self.assertEqual(acceptance.alpha_comparison([result]).empirical, 1.0)


if __name__ == "__main__":
  absltest.main()
