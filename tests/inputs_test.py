"""Tests for spec_decode.inputs."""

import gzip
import pathlib
import re
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from spec_decode import inputs


class ReadTextTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    directory = tempfile.TemporaryDirectory()
    self.addCleanup(directory.cleanup)
    self.dir = pathlib.Path(directory.name)

  def test_gzip_files_are_read_through_gzip(self):
    path = self.dir / "corpus.de.gz"
    path.write_bytes(gzip.compress("ein Hund läuft\nzwei\n".encode("utf-8")))
    self.assertEqual(
        inputs.read_text(path, "run.ngram_corpus"), "ein Hund läuft\nzwei\n"
    )

  def test_a_gz_name_that_is_not_gzip_is_one_line(self):
    path = self.dir / "plain.gz"
    path.write_text("not compressed\n")
    with self.assertRaisesRegex(
        ValueError, f"^run.ngram_corpus: {path} is not a gzip file \\(.+\\)$"
    ):
      inputs.read_text(path, "run.ngram_corpus")


class ReadInputsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    directory = tempfile.TemporaryDirectory()
    self.addCleanup(directory.cleanup)
    self.path = pathlib.Path(directory.name) / "inputs.txt"
    self.path.write_text("one\ntwo\n\nthree\n")

  def test_keeps_the_first_num_examples_lines(self):
    self.assertEqual(
        inputs.read_inputs(path=self.path, prefix="> ", num_examples=2),
        ["> one", "> two"],
    )
    self.assertEqual(
        inputs.read_inputs(path=self.path), ["one", "two", "three"]
    )

  @parameterized.parameters(-1, 0, 2.5, True, "2")
  def test_num_examples_other_than_a_positive_int_is_an_error(self, number):
    # -1 took a seqio task's every example, then dropped the last.
    with self.assertRaisesRegex(
        ValueError,
        "(?m)^read_inputs.num_examples must be an int >= 1, or None for all "
        f"inputs, got {re.escape(repr(number))}$",  # gin adds a line.
    ):
      inputs.read_inputs(path=self.path, num_examples=number)


class TrimTest(absltest.TestCase):

  def test_keeps_the_longest_row_rounded_up_in_steps_of_one_and_a_half(self):
    batch = np.zeros((3, 64), np.int32)
    batch[0, :5] = 7
    batch[1, :17] = 7  # The longest row: 17 tokens -> 24 columns.
    trimmed = inputs.trim(batch)
    self.assertEqual(trimmed.shape, (3, 24))
    np.testing.assert_array_equal(trimmed, batch[:, :24])
    self.assertEqual(inputs.trim(batch[:, :16]).shape, (3, 16))
    self.assertEqual(inputs.trim(batch[[0, 2]]).shape, (2, 8))
    self.assertEqual(inputs.trim(batch[[0, 2]], minimum=1).shape, (2, 6))
    self.assertEqual(inputs.trim(batch[[0, 2]], minimum=7).shape, (2, 8))

  def test_padded_lengths_are_powers_of_two_and_three_halves_of_them(self):
    lengths = [inputs.padded_length(n) for n in range(1, 130)]
    self.assertEqual(
        sorted(set(lengths)),
        [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192],
    )
    for n, length in zip(range(1, 130), lengths):
      self.assertGreaterEqual(length, n)
      self.assertLessEqual(2 * length, 3 * n)  # at most half again

  def test_octaves_are_the_least_powers_of_two(self):
    self.assertEqual(
        [inputs.octave(n) for n in (1, 2, 3, 4, 5, 24, 32, 33, 192)],
        [1, 2, 4, 4, 8, 32, 32, 64, 256],
    )

  def test_never_longer_than_the_batch(self):
    batch = np.full((2, 12), 7, np.int32)
    self.assertEqual(inputs.trim(batch).shape, (2, 12))


if __name__ == "__main__":
  absltest.main()
