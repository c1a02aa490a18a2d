"""Tests for spec_decode.inputs.trim."""

import gzip
import pathlib
import tempfile

from absl.testing import absltest
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
