"""Tests for lookup.py: the prompt-lookup draft's proposals."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import lookup

SOURCE = jnp.array([5, 6, 7, 8, 9, 1, 0, 0])  # 5 content tokens, EOS, pad.
# BOS, then the output: 3 6 7 4 6 7.
OUTPUT = jnp.array([0, 3, 6, 7, 4, 6, 7, 0, 0, 0])


class ProposeTest(parameterized.TestCase):

  @parameterized.named_parameters(
      # "6 7" ends the output and occurred in it before, followed by 4; the
      # source has it too (followed by 8): the output's is more recent.
      ("output_wins_at_equal_length", OUTPUT, 7, 4),
      # After BOS 3 6 7: "6 7" only in the source.
      ("source_match", OUTPUT, 4, 8),
      # After BOS 3: 3 occurs nowhere before; EOS.
      ("no_match_proposes_eos", OUTPUT, 2, 1),
      ("bos_alone_is_no_key", OUTPUT, 1, 1),
      # After BOS 3 6 7 4 6: "4 6" nowhere, "6" last seen at output 2.
      ("longest_then_most_recent", OUTPUT, 6, 7),
      # Key 9: source position 4, followed by the source's EOS.
      ("source_end", jnp.array([0, 9, 0, 0]), 2, 1),
      # Key 8 9 7? No: a longer match in the source beats a shorter one in
      # the output. Output BOS 8 9 2 9: "2 9" nowhere, "9" in the output at
      # 2 (followed by 2) and in the source; at n = 1 the output wins.
      ("shorter_match_in_output", jnp.array([0, 8, 9, 2, 9, 0]), 5, 2),
      # Output BOS 2 8 9: "8 9" in the source (followed by 1), "9" alone
      # nowhere else: the longer source match.
      ("longer_match_in_source", jnp.array([0, 2, 8, 9, 0, 0]), 4, 1),
  )
  def test_proposal(self, output, end, expected):
    got = lookup.propose(SOURCE, output, jnp.int32(end), 3)
    self.assertEqual(int(got), expected)

  def test_stale_tokens_past_the_end_are_ignored(self):
    # Positions at and after `end` hold tokens of an earlier, longer
    # iteration; "3" followed by 6 must not be found there.
    output = jnp.array([0, 4, 3, 6, 0, 0])
    self.assertEqual(int(lookup.propose(SOURCE, output.at[1].set(3), 2, 3)), 1)

  def test_ngrams_longer_than_max_ngram_do_not_count(self):
    # With max_ngram 1 only the last token is the key: "7" was last followed
    # by 4 in the output.
    self.assertEqual(int(lookup.propose(SOURCE, OUTPUT, jnp.int32(7), 1)), 4)


class PromptLookupTest(absltest.TestCase):

  def test_one_call_equals_token_by_token_calls(self):
    draft = lookup.PromptLookup(vocab_size=12, max_ngram=3)
    sources = jnp.array([[5, 6, 7, 8, 9, 1, 0, 0], [2, 3, 2, 3, 4, 1, 0, 0]])
    tokens = jnp.array([[0, 5, 6, 3, 6, 7], [0, 2, 3, 4, 2, 3]])
    whole, cache = draft(tokens, lookup.init_cache(sources, 8))
    np.testing.assert_array_equal(cache.lengths, [6, 6])
    step_cache = lookup.init_cache(sources, 8)
    for t in range(tokens.shape[1]):
      logits, step_cache = draft(tokens[:, t : t + 1], step_cache)
      np.testing.assert_array_equal(logits[:, 0], whole[:, t])
    # One-hots in logit form: 0 on the proposal, -inf elsewhere. Row 0
    # after "5 6 3 6": "6" was last followed by 3 in the output (the source's
    # 7 is older). Row 1 after "2 3": the source's last "2 3" is followed
    # by 4; after "2 3 4 2 3", the output's "2 3" by 4.
    proposals = jnp.argmax(whole, axis=-1)
    np.testing.assert_array_equal(
        proposals, [[1, 6, 7, 1, 3, 8], [1, 3, 4, 1, 3, 4]]
    )
    self.assertTrue(np.all(np.sum(np.isfinite(whole), axis=-1) == 1))
    probs = jax.nn.softmax(whole, axis=-1)
    np.testing.assert_array_equal(jnp.max(probs, axis=-1), 1.0)


if __name__ == "__main__":
  absltest.main()
