"""Tests for spec_decode.data: the demo vocabulary and the seqio tasks.

Everything here reads the files shipped in spec_decode/demo/, so it runs from
a fresh clone without ../shared/data.
"""

import os
import tempfile

from absl.testing import absltest
import numpy as np
import seqio
import sentencepiece as spm
import tensorflow as tf

from spec_decode import batching
from spec_decode import data

_LENGTHS = {"inputs": 48, "targets": 48}


def _tempdir(test):
  directory = tempfile.TemporaryDirectory()
  test.addCleanup(directory.cleanup)
  return directory.name


def _write(directory, name, text):
  path = os.path.join(directory, name)
  with open(path, "w") as f:
    f.write(text)
  return path


def _first_batch(task_name, split, batch_size, **kwargs):
  return next(
      batching.batches(
          task_name, split, batch_size, feature_lengths=_LENGTHS, **kwargs
      )
  )


class VocabularyTest(absltest.TestCase):

  def test_t5_special_ids_and_size(self):
    vocab = data.vocabulary()
    pieces = vocab.tokenizer
    self.assertEqual((vocab.pad_id, vocab.eos_id, vocab.unk_id), (0, 1, 2))
    self.assertEqual(
        [pieces.id_to_piece(i) for i in range(3)], ["<pad>", "</s>", "<unk>"]
    )
    self.assertEqual(pieces.bos_id(), -1)
    self.assertEqual(
        spm.SentencePieceProcessor(
            model_file=str(data.VOCABULARY_FILE)
        ).get_piece_size(),
        data.NUM_PIECES,
    )
    # seqio appends the extra ids, T5's sentinels, from the top down.
    self.assertEqual(vocab.extra_ids, data.EXTRA_IDS)
    self.assertEqual(vocab.decode([4095]), "<extra_id_0>")
    self.assertEqual(
        vocab.decode([data.NUM_PIECES]), f"<extra_id_{data.EXTRA_IDS - 1}>"
    )
    self.assertEqual(vocab.vocab_size, 4096)
    self.assertEqual(vocab.vocab_size % 128, 0)

  def test_multi30k_test_round_trip_without_unknowns(self):
    vocab = data.vocabulary()
    sources, references = data.parallel_text(data.MULTI30K, "test")
    for text in sources[:5] + references[:5]:
      self.assertEqual(vocab.decode(vocab.encode(text)), text)
    ids = np.concatenate([vocab.encode(t) for t in sources + references])
    self.assertNotIn(vocab.unk_id, ids)
    # The prefix is a handful of pieces, not one per character.
    self.assertLessEqual(len(vocab.encode(data.TRANSLATE_PREFIX)), 8)

  def test_train_vocabulary_has_t5_ids(self):
    sources, references = data.parallel_text(data.MULTI30K, "test")
    path = os.path.join(_tempdir(self), "tiny.model")
    data.train_vocabulary(sources[:300] + references[:300], path, 200)
    vocab = data.vocabulary(path, extra_ids=10)
    self.assertEqual((vocab.pad_id, vocab.eos_id, vocab.unk_id), (0, 1, 2))
    self.assertEqual(vocab.tokenizer.bos_id(), -1)
    self.assertEqual(vocab.vocab_size, 210)
    self.assertEqual(vocab.decode(vocab.encode(references[0])), references[0])


class LocalTasksTest(absltest.TestCase):

  def test_split_sizes(self):
    sources, references = data.parallel_text(data.MULTI30K, "test")
    self.assertLen(sources, 1000)
    self.assertLen(references, 1000)
    self.assertLen(data.parallel_text(data.WMT21, "test")[0], 1002)
    with self.assertRaisesRegex(ValueError, "No split 'train'"):
      data.parallel_text(data.WMT21, "train")

  def test_multi30k_examples_are_t5_formatted(self):
    vocab = data.vocabulary()
    sources, references = data.parallel_text(data.MULTI30K, "test")
    batch = _first_batch(data.MULTI30K, "test", 4)
    self.assertEqual(batch["encoder_input_tokens"].shape, (4, 48))
    self.assertEqual(batch["decoder_target_tokens"].shape, (4, 48))
    for row in range(4):
      inputs = batch["encoder_input_tokens"][row]
      targets = batch["decoder_target_tokens"][row]
      weights = batch["decoder_loss_weights"][row]
      self.assertEqual(
          vocab.decode(inputs), "translate English to German: " + sources[row]
      )
      self.assertEqual(vocab.decode(targets), references[row])
      num_targets = int(weights.sum())
      self.assertEqual(targets[num_targets - 1], vocab.eos_id)
      self.assertEqual(inputs[(inputs > 0).sum() - 1], vocab.eos_id)
      np.testing.assert_array_equal(
          batch["decoder_input_tokens"][row][:num_targets],
          np.concatenate([[0], targets[: num_targets - 1]]),
      )
    np.testing.assert_array_equal(
        data.encoder_inputs(sources[:4], vocab, 48),
        batch["encoder_input_tokens"],
    )

  def test_wmt21_test_split(self):
    vocab = data.vocabulary()
    sources, references = data.parallel_text(data.WMT21, "test")
    batch = _first_batch(data.WMT21, "test", 2)
    self.assertEqual(
        vocab.decode(batch["decoder_target_tokens"][1]), references[1]
    )
    self.assertTrue(
        vocab.decode(batch["encoder_input_tokens"][1]).startswith(
            data.TRANSLATE_PREFIX + sources[1][:20]
        )
    )

  def test_distillation_task_from_files(self):
    directory = _tempdir(self)
    name = data.distillation_task(
        target_file=_write(directory, "out.de", "Ein Hund.\nZwei Katzen.\n"),
        source_file=_write(directory, "src.en", "A dog.\nTwo cats.\n"),
        name="distill_test",
    )
    vocab = data.vocabulary()
    batch = _first_batch(name, "train", 2, shuffle=False)
    self.assertEqual(
        [vocab.decode(t) for t in batch["decoder_target_tokens"]],
        ["Ein Hund.", "Zwei Katzen."],
    )
    self.assertEqual(
        vocab.decode(batch["encoder_input_tokens"][0]),
        "translate English to German: A dog.",
    )

  def test_distillation_files_must_align(self):
    directory = _tempdir(self)
    name = data.distillation_task(
        target_file=_write(directory, "out.de", "Ein Hund.\n"),
        source_file=_write(directory, "src.en", "A dog.\nTwo cats.\n"),
        name="distill_misaligned",
    )
    with self.assertRaisesRegex(ValueError, "has 2 lines but"):
      _first_batch(name, "train", 2)

  def test_missing_multi30k_directory_says_what_to_bind(self):
    with self.assertRaisesRegex(FileNotFoundError, "multi30k_dir.directory"):
      data.multi30k_dir("/no/such/multi30k")

  def test_bleu(self):
    references = ["Ein Hund läuft im Park.", "Zwei Katzen schlafen."]
    self.assertAlmostEqual(data.bleu(references, references)["bleu"], 100.0)
    self.assertLess(
        data.bleu(references, ["Ein Hund.", "Katzen."])["bleu"], 50.0
    )


class PaperTasksTest(absltest.TestCase):
  """The TFDS tasks register without their data; formatting is checked."""

  def _check_task(self, name, tfds_name, formatter, example, expected):
    task = seqio.get_mixture_or_task(name)
    self.assertIsInstance(task.source, seqio.TfdsDataSource)
    self.assertEqual(task.source.tfds_dataset.name, tfds_name)
    self.assertEqual(
        list(task.preprocessors),
        [
            formatter,
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ],
    )
    for feature in task.output_features.values():
      self.assertTrue(feature.add_eos)
      self.assertEqual(
          feature.vocabulary.sentencepiece_model_file, data.T5_VOCABULARY_FILE
      )
      self.assertEqual(feature.vocabulary.extra_ids, 100)
    dataset = tf.data.Dataset.from_tensors(example)
    formatted = next(iter(formatter(dataset).as_numpy_iterator()))
    self.assertEqual({k: v.decode() for k, v in formatted.items()}, expected)

  def test_wmt_t2t(self):
    self._check_task(
        data.WMT_T2T,
        "wmt_t2t_translate/de-en:1.0.0",
        data.translate_en_de,
        {"en": "A dog.", "de": "Ein Hund."},
        {
            "inputs": "translate English to German: A dog.",
            "targets": "Ein Hund.",
        },
    )

  def test_cnn_dailymail(self):
    self._check_task(
        data.CNN_DAILYMAIL,
        "cnn_dailymail:3.4.0",
        data.summarize_cnn_dailymail,
        {"article": "Long text.", "highlights": "Short.", "id": "0"},
        {"inputs": "summarize: Long text.", "targets": "Short."},
    )


if __name__ == "__main__":
  absltest.main()
