"""Tests for spec_decode.speculative: the verifier choice and early stop.

Both verifiers ('token' and 'block'), with and without the draft's early stop
(draft_threshold), in the whole loop (`VerifierAndEarlyStopTest`).

The greedy equality tests are in speculative_greedy_test.py, the counting and
PRNG-call tests in speculative_counts_test.py; the runs they share are in
loop_runs.py. The kernels themselves are tested in block_kernel_test.py and
token_kernel_test.py.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

import fake_models
import loop_runs
from spec_decode import sampling
from spec_decode import speculative


class VerifierAndEarlyStopTest(parameterized.TestCase):
  """Both verifiers, with and without early stop, in the whole loop."""

  @parameterized.product(
      verifier=["token", "block"], draft_threshold=[0.0, 0.5, 0.9]
  )
  def test_greedy_matches_baseline(self, verifier, draft_threshold):
    max_decode_len, gamma = 14, 4
    target = fake_models.random_model(0, loop_runs.VOCAB_SIZE, eos_bias=0.5)
    draft_model = fake_models.perturbed(target, 1, 1.5)
    for batch_size in loop_runs.BATCH_SIZES:
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
          config=loop_runs.GREEDY,
          verifier=verifier,
          draft_threshold=draft_threshold,
      )
      baseline = loop_runs.run_baseline(
          target,
          contexts,
          max_decode_len=max_decode_len,
          config=loop_runs.GREEDY,
      )
      np.testing.assert_array_equal(result.sequences, baseline.sequences)
      np.testing.assert_array_equal(result.lengths, baseline.lengths)
      loop_runs.check_token_sources(result)
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
    target = fake_models.random_model(3, loop_runs.VOCAB_SIZE, eos_bias=-np.inf)
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
    target = fake_models.random_model(0, loop_runs.VOCAB_SIZE)
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
