"""Tests for spec_decode.translate_progress: kept batches, and what resumes."""

import pathlib
import tempfile

from absl.testing import absltest

from spec_decode import translate_progress


def _setting(seed=0, sources=("a", "b", "c")):
  return translate_progress.setting(list(sources), 2, (64, 64), 1.0, seed, "x")


class ProgressTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.path = pathlib.Path(tempfile.mkdtemp()) / "out.de.progress.jsonl"

  def test_batches_added_are_read_back_by_the_next_run(self):
    progress = translate_progress.Progress(self.path, _setting())
    self.assertEqual(progress.done, {})
    progress.add(0, ["eins", "zwei"])
    progress.add(2, ["drei"])
    self.assertEqual(
        progress.interrupted(3),
        f"after 2 of 3 batches; they are kept in {self.path}, and the same "
        "command resumes after them",
    )
    again = translate_progress.Progress(self.path, _setting())
    self.assertEqual(again.done, {0: ["eins", "zwei"], 2: ["drei"]})
    again.finish()
    self.assertFalse(self.path.exists())

  def test_a_line_cut_off_as_it_was_written_is_decoded_again(self):
    progress = translate_progress.Progress(self.path, _setting())
    progress.add(0, ["eins", "zwei"])
    progress.interrupted(2)
    with open(self.path, "a", encoding="utf-8") as f:
      f.write('{"batch": 1, "outputs": ["dr')  # Killed mid-write.
    again = translate_progress.Progress(self.path, _setting())
    self.assertEqual(again.done, {0: ["eins", "zwei"]})

  def test_another_setting_is_an_error_not_mixed_in(self):
    translate_progress.Progress(self.path, _setting()).add(0, ["eins"])
    for other, differing in (
        (_setting(seed=1), "seed"),
        (_setting(sources=("a", "b", "d")), "inputs_sha256"),
    ):
      with self.assertRaisesRegex(
          ValueError,
          f"^{self.path} holds the batches of another setting \\(differing in "
          f"{differing}\\): remove it to start over$",
      ):
        translate_progress.Progress(self.path, other)

  def test_setting_records_what_the_outputs_depend_on(self):
    self.assertEqual(
        set(_setting()),
        {
            "inputs_sha256",
            "num_inputs",
            "batch_size",
            "max_input_len",
            "max_decode_len",
            "temperature",
            "seed",
            "gin_config_sha256",
        },
    )
    self.assertNotEqual(
        _setting()["gin_config_sha256"],
        translate_progress.setting(["a"], 2, (64, 64), 1.0, 0, "y")[
            "gin_config_sha256"
        ],
    )


if __name__ == "__main__":
  absltest.main()
