"""Tests for spec_decode.speculative: greedy runs emit the baseline's tokens.

At temperature 0 the loop must emit the greedy autoregressive baseline's
tokens whatever the draft: on fake models (`GreedyTest`) and on T5 models
(`T5GreedyTest`).

The loop's counts and PRNG calls are tested in speculative_counts_test.py, its
two verifiers and early stop in speculative_verifiers_test.py; the runs they
share are in loop_runs.py. The kernels' own tests are in block_kernel_test.py
and token_kernel_test.py, the draft's in draft_loop_test.py.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import fake_models
import loop_runs
from spec_decode import decoding
from spec_decode import drafts
from spec_decode import lookup
from spec_decode import speculative
from spec_decode.models import t5

# The T5 loop's: one row, and rows of different input and output lengths.
T5_BATCH_SIZES = (1, 8)


class GreedyTest(parameterized.TestCase):
  """Greedy speculative decoding emits the greedy baseline's tokens."""

  @parameterized.product(
      draft_kind=["other_model", "unigram", "target", "lookup"],
      gamma=[1, 2, 4, 7],
  )
  def test_matches_baseline(self, draft_kind, gamma):
    max_decode_len = 14
    target = fake_models.random_model(0, loop_runs.VOCAB_SIZE, eos_bias=0.5)
    for batch_size in loop_runs.BATCH_SIZES:
      contexts = fake_models.context_ids(batch_size, seed=batch_size)
      capacity = max_decode_len + gamma + 1
      baseline = loop_runs.run_baseline(
          target,
          contexts,
          max_decode_len=max_decode_len,
          config=loop_runs.GREEDY,
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
            lookup.PromptLookup(loop_runs.VOCAB_SIZE),
            lookup.init_cache(source, capacity),
        )
      elif draft_kind == "other_model":
        draft = loop_runs.fake_draft(
            fake_models.perturbed(target, 1, 1.5), contexts, capacity
        )
      elif draft_kind == "unigram":
        corpus = np.random.default_rng(0).integers(
            0, loop_runs.VOCAB_SIZE, (20, 10)
        )
        draft = drafts.ngram_draft(
            drafts.count_unigrams(corpus, loop_runs.VOCAB_SIZE), batch_size
        )
      else:
        draft = loop_runs.fake_draft(target, contexts, capacity)
      result = loop_runs.run_speculative(
          target,
          draft,
          contexts,
          gamma=gamma,
          max_decode_len=max_decode_len,
          config=loop_runs.GREEDY,
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
    target = fake_models.random_model(
        0, loop_runs.VOCAB_SIZE, dtype=jnp.bfloat16
    )
    draft = fake_models.perturbed(target, 1, 1.0)
    contexts = fake_models.context_ids(4)
    result = loop_runs.run_speculative(
        target,
        loop_runs.fake_draft(draft, contexts, 16),
        contexts,
        gamma=3,
        max_decode_len=12,
        config=loop_runs.GREEDY,
    )
    baseline = loop_runs.run_baseline(
        target, contexts, max_decode_len=12, config=loop_runs.GREEDY
    )
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
          config=loop_runs.GREEDY,
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
    draft = self._draft(draft_kind, target, inputs, baseline, capacity)
    result = speculative.speculative_decode(
        target.decode_fn,
        draft.decode_fn,
        target.cache,
        draft.cache,
        jax.random.key(0),
        gamma=gamma,
        max_decode_len=self.MAX_DECODE_LEN,
        config=loop_runs.GREEDY,
    )
    np.testing.assert_array_equal(result.sequences, baseline.sequences)
    np.testing.assert_array_equal(result.lengths, baseline.lengths)
    loop_runs.check_token_sources(result)
    if draft_kind == "target":
      np.testing.assert_array_equal(
          result.target_calls, -(-result.lengths // (gamma + 1))
      )
    if draft_kind == "unigram":
      self.assertGreater(int(result.accepted_tokens.sum()), 0)

  def _draft(self, draft_kind, target, inputs, baseline, capacity):
    """The drafts.Draft of `draft_kind` for `inputs` (a T5, a shared-encoder
    T5, a unigram over the baseline's outputs, prompt lookup, the target)."""
    batch_size = len(inputs)
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
    return draft


if __name__ == "__main__":
  absltest.main()
