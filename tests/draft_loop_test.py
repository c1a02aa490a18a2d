"""Tests for spec_decode.draft_loop: the draft's proposals within an iteration.

The 2-token catch-up that opens each iteration, and the draft cache it leaves.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import fake_models
from spec_decode import draft_loop
from spec_decode import sampling
from spec_decode import speculative

VOCAB_SIZE = 16


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


class ThresholdTest(parameterized.TestCase):
  """The threshold's value is a leaf; whether it stops early, the structure."""

  def test_values_above_0_share_a_structure(self):
    leaves, low = jax.tree.flatten(draft_loop.Threshold(0.3))
    self.assertEqual(leaves, [0.3])
    self.assertEqual(jax.tree.structure(draft_loop.Threshold(0.9)), low)
    self.assertNotEqual(jax.tree.structure(draft_loop.Threshold(0.0)), low)

  def test_traced_value_keeps_the_structure(self):
    @jax.jit
    def stop_and_value(threshold):
      return threshold.early_stop, threshold.value * 2

    early, doubled = stop_and_value(draft_loop.Threshold(0.25))
    self.assertTrue(early)
    self.assertEqual(float(doubled), 0.5)
    self.assertFalse(stop_and_value(draft_loop.Threshold(0))[0])

  @parameterized.parameters(1.0, -0.1, False, "0.5", float("nan"))
  def test_bad_value_is_one_line(self, value):
    with self.assertRaisesRegex(ValueError, r"^draft_threshold must be in"):
      draft_loop.Threshold(value)


if __name__ == "__main__":
  absltest.main()
