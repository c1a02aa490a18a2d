"""spec_decode/greedy_loops: both decoders' greedy loops over set-up batches."""

from absl.testing import absltest
import jax
import numpy as np

from spec_decode import greedy_loops
from spec_decode import pair
from spec_decode.models import t5
import checkpoint_fixtures

_CONFIG = checkpoint_fixtures.SMALL
_MAX_DECODE_LEN = 12


def _model(seed):
  return pair.LoadedModel(
      "target",
      _CONFIG,
      t5.Transformer(_CONFIG),
      t5.init_params(_CONFIG, jax.random.key(seed)),
  )


class GreedyLoopsTest(absltest.TestCase):

  def test_the_target_as_its_own_draft_emits_the_baselines_tokens(self):
    rng = np.random.default_rng(0)
    batches = [
        rng.integers(2, _CONFIG.vocab_size, (2, 8)).astype(np.int32)
        for _ in range(2)
    ]
    decoders = greedy_loops.set_up(
        _model(0), None, batches, gamma=3, max_decode_len=_MAX_DECODE_LEN
    )
    self.assertLen(decoders, 2)
    common = dict(max_decode_len=_MAX_DECODE_LEN, eos_id=-1)
    expected = jax.device_get(greedy_loops.baseline(decoders, **common)())
    speculative = greedy_loops.speculative_loop(decoders, gamma=3, **common)
    got = jax.device_get(speculative())
    self.assertLen(got, 2)
    for base, spec in zip(expected, got):
      self.assertEqual(base.sequences.shape, (2, _MAX_DECODE_LEN))
      np.testing.assert_array_equal(spec.sequences, base.sequences)
      # Every draft accepted: gamma + 1 = 4 tokens a target call, 12 in 3.
      np.testing.assert_array_equal(spec.target_calls, 3)
    # The caches are set up once and decoded from again: a second run of
    # the loop emits the same tokens.
    for first, second in zip(got, jax.device_get(speculative())):
      np.testing.assert_array_equal(second.sequences, first.sequences)


if __name__ == "__main__":
  absltest.main()
