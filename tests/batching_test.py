"""Tests for spec_decode.batching: padded and length-bucketed batches."""

from absl.testing import absltest
import numpy as np

from spec_decode import batching
from spec_decode import data

_LENGTHS = {"inputs": 48, "targets": 48}


class BatchesTest(absltest.TestCase):

  def test_length_buckets(self):
    buckets = [(24, 16), (32, 24)]
    shapes = set()
    seen = 0
    for batch in batching.batches(
        data.MULTI30K,
        "test",
        16,
        feature_lengths=_LENGTHS,
        length_buckets=buckets,
    ):
      shape = (
          batch["encoder_input_tokens"].shape[1],
          batch["decoder_target_tokens"].shape[1],
      )
      self.assertIn(shape, buckets + [(48, 48)])
      self.assertEqual(batch["decoder_input_tokens"].shape[1], shape[1])
      self.assertEqual(batch["decoder_loss_weights"].shape[1], shape[1])
      # Every example still ends in its EOS: nothing was cut by the bucket.
      for tokens in (
          batch["encoder_input_tokens"],
          batch["decoder_target_tokens"],
      ):
        lengths = (tokens > 0).sum(axis=1)
        np.testing.assert_array_equal(tokens[np.arange(16), lengths - 1], 1)
      shapes.add(shape)
      seen += 16
    self.assertGreater(len(shapes), 1)
    # Only each bucket's last, partial batch is dropped.
    self.assertGreater(seen, 1000 - 16 * 3)


if __name__ == "__main__":
  absltest.main()
