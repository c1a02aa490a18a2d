"""Tests for spec_decode.drafts."""

import dataclasses

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

import fake_models
from spec_decode import decoding
from spec_decode import drafts
from spec_decode import sampling
from spec_decode import speculative
from spec_decode.models import t5

# Tokens: BOS/pad 0, EOS 1, then 2..5.
CORPUS = [[2, 3, 1], [2, 2, 3, 1], [4, 1]]


class SpeculativeCapacityTest(absltest.TestCase):

  def test_room_for_the_last_block_in_whole_steps(self):
    for max_decode_len in (12, 64, 256):
      for gamma in range(1, 25):
        capacity = drafts.speculative_capacity(max_decode_len, gamma)
        needed = max_decode_len + gamma + 1
        self.assertBetween(capacity - needed, 0, drafts.CAPACITY_STEP - 1)
        self.assertEqual((capacity - max_decode_len) % drafts.CAPACITY_STEP, 0)

  def test_one_capacity_for_every_gamma_under_a_step(self):
    self.assertEqual(
        {drafts.speculative_capacity(64, gamma) for gamma in range(1, 8)},
        {72},
    )
    self.assertEqual(drafts.speculative_capacity(64, 8), 80)
    # T5 1.1 XXL's run at gamma 7 keeps its 264 positions.
    self.assertEqual(drafts.speculative_capacity(256, 7), 264)


class NgramTest(absltest.TestCase):

  def test_unigram_probabilities_are_corpus_frequencies(self):
    model = drafts.count_unigrams(CORPUS, 6)
    # Counts over the 9 tokens: 1 x3, 2 x3, 3 x2, 4 x1.
    expected = np.array([0, 3, 3, 2, 1, 0]) / 9
    logits, cache = model(jnp.array([[0, 5, 2]]), model.init_cache(1))
    np.testing.assert_allclose(
        jax.nn.softmax(logits, axis=-1),
        np.broadcast_to(expected, (1, 3, 6)),
        atol=1e-7,
    )
    np.testing.assert_array_equal(cache.lengths, [3])

  def test_bigram_counts_after_bos_and_backs_off_to_unigram(self):
    model = drafts.count_bigrams(CORPUS, 6)
    logits, cache = model(
        jnp.array([[0, 2, 3, 4], [1, 5, 2, 0]]), model.init_cache(2)
    )
    probs = np.asarray(jax.nn.softmax(logits, axis=-1))
    unigram = np.array([0, 3, 3, 2, 1, 0]) / 9
    after_bos = np.array([0, 0, 2, 0, 1, 0]) / 3
    after_2 = np.array([0, 0, 1, 2, 0, 0]) / 3
    after_3 = np.array([0, 1, 0, 0, 0, 0])
    after_4 = np.array([0, 1, 0, 0, 0, 0])
    np.testing.assert_allclose(
        probs,
        [
            [after_bos, after_2, after_3, after_4],
            # EOS and 5 never precede a token: unigram.
            [unigram, unigram, after_2, after_bos],
        ],
        atol=1e-7,
    )
    np.testing.assert_array_equal(cache.lengths, [4, 4])

  def test_unseen_tokens_are_never_drafted_and_output_is_unchanged(self):
    # Tokens 4 and 5 have draft probability 0; the target still emits them.
    target = fake_models.random_model(0, 6, eos_bias=-1.0)
    draft = drafts.ngram_draft(drafts.count_bigrams(CORPUS[:2], 6), 4)
    contexts = fake_models.context_ids(4)
    greedy = sampling.SamplingConfig(temperature=0.0)
    result = speculative.speculative_decode(
        target,
        draft.decode_fn,
        target.init_cache(contexts, 16),
        draft.cache,
        jax.random.key(0),
        gamma=3,
        max_decode_len=12,
        config=greedy,
    )
    baseline = decoding.autoregressive_decode(
        target,
        target.init_cache(contexts, 12),
        jax.random.key(0),
        max_decode_len=12,
        config=greedy,
    )
    np.testing.assert_array_equal(result.sequences, baseline.sequences)
    self.assertTrue(np.isin(np.asarray(result.sequences), [4, 5]).any())

  def test_invalid_corpora_raise(self):
    with self.assertRaisesRegex(ValueError, "no tokens"):
      drafts.count_unigrams([[]], 6)
    with self.assertRaisesRegex(ValueError, "outside"):
      drafts.count_bigrams([[2, 6]], 6)


class DraftsInspectedTest(absltest.TestCase):
  """The drafts themselves: a token the corpus never holds is never drafted.

  A sampled decode of 64 rows with a bigram draft that has no mass on tokens
  4 and 5; every drafted token the target judged (the accepted ones, and the
  rejected one at each replacement) is read back from the result.
  """

  def test_judged_drafts_hold_only_corpus_tokens(self):
    target = fake_models.random_model(0, 6, eos_bias=-1.0)
    draft = drafts.ngram_draft(drafts.count_bigrams(CORPUS[:2], 6), 64)
    contexts = fake_models.context_ids(64)
    result = speculative.speculative_decode(
        target,
        draft.decode_fn,
        target.init_cache(contexts, 16),
        draft.cache,
        jax.random.key(0),
        gamma=3,
        max_decode_len=12,
        config=sampling.SamplingConfig(),
    )
    sources = np.asarray(result.token_sources)
    sequences = np.asarray(result.sequences)
    accepted = sequences[sources == speculative.ACCEPTED]
    rejected = np.asarray(result.rejected_tokens)[
        sources == speculative.REPLACEMENT
    ]
    judged = np.concatenate([accepted, rejected])
    self.assertLen(judged, int(result.drafted_tokens.sum()))
    self.assertGreater(len(judged), 200)
    self.assertEqual(set(judged.tolist()) & {4, 5}, set())
    # All of the corpus's tokens are drafted, and the target emits 4 and 5.
    self.assertEqual(set(judged.tolist()), {1, 2, 3})
    self.assertTrue(np.isin(sequences, [4, 5]).any())


class T5PairTest(absltest.TestCase):
  """`t5_pair` sets up each kind of T5 draft as its own function does."""

  TARGET = fake_models.tiny_t5(97)

  def _check(self, pair, expected, tokens):
    for mine, theirs in zip(pair, expected):
      for leaf, want in zip(
          jax.tree.leaves(mine.cache), jax.tree.leaves(theirs.cache)
      ):
        np.testing.assert_array_equal(leaf, want)
      np.testing.assert_array_equal(
          mine.decode_fn(tokens, mine.cache)[0],
          theirs.decode_fn(tokens, theirs.cache)[0],
      )

  def test_both_draft_kinds(self):
    inputs = np.array([[5, 9, 3, 1, 0], [7, 2, 1, 0, 0]], np.int32)
    tokens = jnp.array([[0, 4], [0, 6]], jnp.int32)
    target = t5.Transformer(self.TARGET)
    target_params = t5.init_params(self.TARGET, jax.random.key(0))
    expected_target = drafts.t5_draft(target, target_params, inputs, 9)
    own = dataclasses.replace(self.TARGET, emb_dim=8, head_dim=4, mlp_dim=16)
    shared = dataclasses.replace(
        own, num_encoder_layers=0, shared_encoder_dim=16
    )
    for config in (own, shared):
      with self.subTest(shared_encoder=bool(config.shared_encoder_dim)):
        model = t5.Transformer(config)
        params = t5.init_params(config, jax.random.key(1))
        pair = drafts.t5_pair(target, target_params, model, params, inputs, 9)
        if config.shared_encoder_dim:
          _, draft_cache = drafts.shared_encoder_caches(
              target, target_params, model, params, inputs, 9
          )
          expected_draft = drafts.Draft(
              t5.make_decode_fn(model, params), draft_cache
          )
        else:
          expected_draft = drafts.t5_draft(model, params, inputs, 9)
        self._check(pair, (expected_target, expected_draft), tokens)


class KeysInOctavesTest(absltest.TestCase):
  """A cache holds a power of two of keys, whatever the inputs' length."""

  def test_padded_keys_are_masked_and_change_no_logit(self):
    config = fake_models.tiny_t5(97)
    model = t5.Transformer(config)
    params = t5.init_params(config, jax.random.key(0))
    inputs = np.array([[5, 9, 3, 8, 1, 0], [7, 2, 1, 0, 0, 0]], np.int32)
    cache = drafts.t5_cache(model, params, inputs, 9)
    self.assertEqual(cache.encoder_mask.shape, (2, 8))
    np.testing.assert_array_equal(cache.encoder_mask[:, 6:], False)
    for keys, values in zip(cache.cross_keys, cache.cross_values):
      self.assertEqual(keys.shape[-1], 8)  # [B, H, D, S']
      self.assertEqual(values.shape[-2], 8)  # [B, H, S', D]
    encoded = model.apply(
        {"params": params}, inputs, method=t5.Transformer.encode
    )  # [B, 6, E]
    unpadded = model.apply(
        {"params": params},
        encoded,
        inputs,
        9,
        method=t5.Transformer.init_cache,
    )
    decode_fn = t5.make_decode_fn(model, params)
    tokens = jnp.array([[0, 4, 11], [0, 6, 2]], jnp.int32)
    np.testing.assert_allclose(
        decode_fn(tokens, cache)[0],
        decode_fn(tokens, unpadded)[0],
        rtol=1e-6,
        atol=1e-6,
    )

  def test_powers_of_two_are_left_alone(self):
    encoded, tokens = jnp.ones((2, 8, 3)), jnp.ones((2, 8), jnp.int32)
    padded = drafts.keys_in_octaves(encoded, tokens)
    self.assertIs(padded[0], encoded)
    self.assertIs(padded[1], tokens)


if __name__ == "__main__":
  absltest.main()
