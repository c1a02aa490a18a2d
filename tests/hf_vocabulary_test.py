"""A checkpoint's spiece.model as the run's vocabulary, equal to T5Tokenizer.

The SentencePiece model is trained here (tests/hf_directories.py) on
made-up sentences with accents, digits and punctuation; transformers'
`T5Tokenizer` reads the same file from the directory, with its 100 extra ids.
"""

import os
import pathlib
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
import gin
import seqio
import transformers

from spec_decode import compare
from spec_decode import gin_config
from spec_decode import report
from spec_decode import vocabulary
import hf_directories

_EOS_ID = 1


class HfVocabularyTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = pathlib.Path(tempfile.mkdtemp())
    cls.checkpoint = cls.root / "checkpoint"
    hf_directories.train_spiece(cls.checkpoint)
    cls.tokenizer = transformers.T5Tokenizer.from_pretrained(
        str(cls.checkpoint)
    )

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root)
    super().tearDownClass()

  def tearDown(self):
    gin.clear_config()
    super().tearDown()

  def test_ids_equal_t5_tokenizer(self):
    ours = vocabulary.checkpoint_vocabulary(str(self.checkpoint))
    self.assertEqual(ours.vocab_size, hf_directories.SPM_PIECES + 100)
    self.assertEqual(ours.vocab_size, len(self.tokenizer))
    lines = hf_directories.sentences(300, seed=1)
    # Sentinels inside text, as span-corruption inputs have them.
    lines += [f"{line} <extra_id_{i}> end" for i, line in enumerate(lines[:40])]
    lines += ["<extra_id_99>", "<extra_id_0>"]
    for line in lines:
      self.assertEqual(
          list(ours.encode(line)) + [_EOS_ID],
          self.tokenizer(line).input_ids,
          line,
      )
    self.assertEqual(
        [ours.vocab_size - 1, ours.vocab_size - 100],
        self.tokenizer.convert_tokens_to_ids(["<extra_id_0>", "<extra_id_99>"]),
    )

  def test_found_from_directory_file_or_home(self):
    (self.checkpoint / "config.json").write_text("{}")
    with mock.patch.dict(os.environ, {"HOME": str(self.root)}):
      for path in (
          self.checkpoint,
          self.checkpoint / "config.json",
          self.checkpoint / "spiece.model",
          "~/checkpoint",
      ):
        found = vocabulary.checkpoint_vocabulary(str(path))
        self.assertEqual(
            found.sentencepiece_model_file,
            str(self.checkpoint / "spiece.model"),
        )
        self.assertEqual(found.vocab_size, 400)

  def test_missing_vocabulary_is_one_line(self):
    empty = self.root / "empty"
    empty.mkdir(exist_ok=True)
    with self.assertRaises(ValueError) as raised:
      vocabulary.checkpoint_vocabulary(str(empty))
    self.assertEqual(
        report.one_line(raised.exception),
        f"no vocabulary at {empty}: expected a SentencePiece model file or a "
        "directory holding spiece.model; bind run.vocabulary",
    )

  def test_unreadable_vocabulary_is_one_line(self):
    corrupt = self.root / "corrupt"
    corrupt.mkdir(exist_ok=True)
    (corrupt / "spiece.model").write_bytes(b"not a sentencepiece model")
    for make in (
        lambda: vocabulary.checkpoint_vocabulary(str(corrupt)),
        lambda: vocabulary.checked(
            seqio.SentencePieceVocabulary(str(corrupt / "spiece.model"))
        ),
        lambda: vocabulary.checked(
            seqio.SentencePieceVocabulary(str(self.root / "missing.model"))
        ),
    ):
      with self.assertRaises(ValueError) as raised:
        make()
      self.assertRegex(
          report.one_line(raised.exception),
          r"^cannot read the vocabulary \S+\.model: \S",
      )

  def test_translate_takes_the_checkpoint_vocabulary(self):
    gin_config.parse([], [f"target/checkpoint_path.path = '{self.checkpoint}'"])
    self.assertEqual(
        vocabulary.bound_for_run().sentencepiece_model_file,
        str(self.checkpoint / "spiece.model"),
    )

  def test_run_without_vocabulary_or_spiece_is_one_line(self):
    gin_config.parse(
        [],
        [
            f"target/checkpoint_path.path = '{self.root / 'empty'}'",
            "run.output_dir = '/tmp/unused'",
            "run.gamma = 2",
            "read_inputs.prompt = 'a'",
        ],
    )
    (self.root / "empty").mkdir(exist_ok=True)
    with self.assertRaises(ValueError) as raised:
      compare.run()
    self.assertEqual(
        report.one_line(raised.exception),
        f"run.vocabulary is not set and the target checkpoint "
        f"{self.root / 'empty'} has no spiece.model: bind run.vocabulary",
    )


if __name__ == "__main__":
  absltest.main()
