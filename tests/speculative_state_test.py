"""speculative_state: step 4 of an iteration, on hand-made blocks.

Four rows, gamma 3, EOS = 1, max_decode_len 8:
  row 0: 2 of 3 drafts accepted, replaced: emits x_1 x_2 and the
    replacement.
  row 1: all 3 accepted: emits x_1..x_3 and the bonus token.
  row 2: all accepted, but x_2 is EOS: emits x_1 x_2 and stops there.
  row 3: 6 tokens out, 2 left before max_decode_len: emits x_1 x_2.
A fifth row, done before the iteration, emits nothing.
"""

from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from spec_decode import speculative_result as result_lib
from spec_decode import speculative_state
import fake_models

_A, _R, _B = result_lib.ACCEPTED, result_lib.REPLACEMENT, result_lib.BONUS

DRAFTS = jnp.array(
    [[5, 6, 7], [5, 6, 7], [5, 1, 7], [5, 6, 7], [5, 6, 7]], jnp.int32
)
NUM_ACCEPTED = jnp.array([2, 3, 3, 3, 0], jnp.int32)
NEXT = jnp.array([9, 8, 8, 8, 9], jnp.int32)
NUM_DRAFTED = jnp.full((5,), 3, jnp.int32)
LENGTHS = jnp.array([0, 0, 0, 6, 3], jnp.int32)
DONE = jnp.array([False, False, False, False, True])


def _commit():
  return speculative_state.commit(
      DRAFTS,
      NUM_ACCEPTED,
      NEXT,
      NUM_DRAFTED,
      LENGTHS,
      DONE,
      eos_id=1,
      max_decode_len=8,
  )


class CommitTest(absltest.TestCase):

  def test_block_and_emitted_counts(self):
    block, _, _, num_emitted, hit_eos = _commit()
    np.testing.assert_array_equal(
        np.asarray(block)[:4],
        [[5, 6, 9, 9], [5, 6, 7, 8], [5, 1, 7, 8], [5, 6, 7, 8]],
    )
    np.testing.assert_array_equal(num_emitted, [3, 4, 2, 2, 0])
    np.testing.assert_array_equal(hit_eos, [False, False, True, False, False])

  def test_sources_and_rejected(self):
    _, sources, rejected, _, _ = _commit()
    # The emitted positions only (3 and 4 tokens); the rest is junk.
    np.testing.assert_array_equal(np.asarray(sources)[0, :3], [_A, _A, _R])
    np.testing.assert_array_equal(np.asarray(sources)[1], [_A, _A, _A, _B])
    # The rejected draft sits at its replacement; -1 elsewhere.
    np.testing.assert_array_equal(np.asarray(rejected)[0, :3], [-1, -1, 7])
    np.testing.assert_array_equal(np.asarray(rejected)[1], [-1, -1, -1, -1])


class AdvanceTest(absltest.TestCase):

  def test_history_lengths_done_and_counts(self):
    batch_size, capacity = 5, 8 + 3 + 1
    cache = fake_models.FakeCache(
        prefix_hashes=jnp.zeros((batch_size, capacity), jnp.uint32),
        contexts=jnp.zeros((batch_size,), jnp.uint32),
        lengths=LENGTHS,
    )
    state = speculative_state.initial_state(cache, cache, history_len=13)
    # Rows 3 and 4 already hold tokens (token i at history[i], BOS at 0).
    state = state.replace(lengths=LENGTHS, done=DONE)
    beta = jnp.full((batch_size, 3), 0.5, jnp.float32)
    nonfinite = jnp.zeros((batch_size, 4), bool).at[1, 2].set(True)
    new = speculative_state.advance(
        state,
        DRAFTS,
        _commit(),
        num_accepted=NUM_ACCEPTED,
        num_drafted=NUM_DRAFTED,
        beta=beta,
        draft_steps=jnp.array(3, jnp.int32),
        target_cache=cache,
        draft_cache=cache,
        nonfinite=nonfinite.at[4].set(True),
        max_decode_len=8,
    )
    np.testing.assert_array_equal(new.lengths, [3, 4, 2, 8, 3])
    np.testing.assert_array_equal(new.target_cache.lengths, new.lengths)
    np.testing.assert_array_equal(new.done, [False, False, True, True, True])
    history = np.asarray(new.history)
    np.testing.assert_array_equal(history[0, :4], [0, 5, 6, 9])
    np.testing.assert_array_equal(history[1, :5], [0, 5, 6, 7, 8])
    np.testing.assert_array_equal(history[2, :3], [0, 5, 1])
    np.testing.assert_array_equal(history[3, 7:9], [5, 6])
    # A done row's length stays; what lies past it is garbage by design.
    np.testing.assert_array_equal(history[4, :4], [0, 0, 0, 0])
    # Judged: up to the first rejection, EOS and max_decode_len.
    np.testing.assert_array_equal(new.drafted_tokens, [3, 3, 2, 2, 0])
    np.testing.assert_array_equal(new.accepted_tokens, [2, 3, 2, 2, 0])
    np.testing.assert_allclose(new.beta_sum, [1.5, 1.5, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(new.target_calls, [1, 1, 1, 1, 0])
    np.testing.assert_array_equal(new.draft_calls, [3, 3, 3, 3, 0])
    # A live row's NaN counts; a done row's does not.
    np.testing.assert_array_equal(
        new.nonfinite, [False, True, False, False, False]
    )
    self.assertEqual(int(new.cur_index), 1)


if __name__ == "__main__":
  absltest.main()
