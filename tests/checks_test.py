"""Tests for spec_decode.checks."""

from absl.testing import absltest
import numpy as np

from spec_decode import checks


class ChecksTest(absltest.TestCase):

  def test_numbers(self):
    for value in (0, 1.5, -2, np.float32(0.5), np.int64(3), float("inf")):
      self.assertTrue(checks.is_number(value), value)
    for value in (True, False, "0.5", None, [1.0]):
      self.assertFalse(checks.is_number(value), value)

  def test_ints(self):
    for value in (0, -1, 7):
      self.assertTrue(checks.is_int(value), value)
    for value in (True, False, 2.0, "3", None, np.float32(1)):
      self.assertFalse(checks.is_int(value), value)

  def test_count(self):
    checks.check_count(3, "run.batch_size")
    for value in (0, -1, True, 2.0, "3", None):
      with self.assertRaisesRegex(
          ValueError, f"^run.batch_size must be an int >= 1, got {value!r}$"
      ):
        checks.check_count(value, "run.batch_size")

  def test_integers(self):
    for value in (0, -1, np.int32(3), np.int64(-2)):
      self.assertTrue(checks.is_integer(value), value)
    for value in (True, np.bool_(True), 2.0, np.float32(1), "3", None):
      self.assertFalse(checks.is_integer(value), value)


if __name__ == "__main__":
  absltest.main()
