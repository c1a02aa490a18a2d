"""Tests for spec_decode.inputs.trim."""

from absl.testing import absltest
import numpy as np

from spec_decode import inputs


class TrimTest(absltest.TestCase):

  def test_keeps_the_longest_row_rounded_up_to_a_power_of_two(self):
    batch = np.zeros((3, 64), np.int32)
    batch[0, :5] = 7
    batch[1, :17] = 7  # The longest row: 17 tokens -> 32 columns.
    trimmed = inputs.trim(batch)
    self.assertEqual(trimmed.shape, (3, 32))
    np.testing.assert_array_equal(trimmed, batch[:, :32])
    self.assertEqual(inputs.trim(batch[:, :16]).shape, (3, 16))
    self.assertEqual(inputs.trim(batch[[0, 2]]).shape, (2, 8))
    self.assertEqual(inputs.trim(batch[[0, 2]], minimum=1).shape, (2, 8))
    self.assertEqual(inputs.trim(batch[[0, 2]], minimum=3).shape, (2, 8))

  def test_never_longer_than_the_batch(self):
    batch = np.full((2, 12), 7, np.int32)
    self.assertEqual(inputs.trim(batch).shape, (2, 12))


if __name__ == "__main__":
  absltest.main()
