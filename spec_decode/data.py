"""seqio tasks and vocabularies: En->De translation and CNN/DailyMail.

Tasks, registered with seqio at import:

* `multi30k_en_de`: Multi30k (Elliott et al., 2016) English->German image
  captions, all three splits shipped with the package (1.3 MB gzipped);
  `train` and `validation` are read from `multi30k_dir()`, which a gin
  binding can point elsewhere.
* `wmt21_en_de`: the WMT21 English->German news test set, `test` only, shipped
  with the package.
* `wmt_t2t_en_de` and `cnn_dailymail`: the paper's tasks (Leviathan et al.,
  2023, Table 2) through TFDS, `wmt_t2t_translate/de-en` and `cnn_dailymail`,
  for users who have those datasets; they use T5's public vocabulary.
  Registering them reads nothing: TFDS is opened only by `get_dataset`.

Inputs are formatted as T5 formats them (Raffel et al., 2020, Appendix D):
"translate English to German: <text>" and "summarize: <article>". Every
feature ends in EOS.

The demo vocabulary is a SentencePiece unigram model trained on Multi30k's
training text, the prefixed English inputs and the German targets together
(`train_vocabulary`, `vocabulary_sentences`), with T5's ids: pad 0, eos 1,
unk 2, no BOS, and extra ids at the top of the range.

Usage (`spec_decode.batching` batches a task):
  vocab = data.vocabulary()
  sources, references = data.parallel_text(data.MULTI30K, "test")
  inputs = data.encoder_inputs(sources[:8], vocab, 48)  # int32 [8, 48]
"""

from collections.abc import Iterable, Iterator, Sequence
import functools
import gzip
import io
import pathlib

import gin
import numpy as np
import sacrebleu
import seqio
import sentencepiece as spm
import tensorflow as tf

# seqio's pipelines are tf.data on the host: TensorFlow must leave the
# accelerators, and their memory, to JAX.
tf.config.set_visible_devices([], "GPU")

DEMO_DIR = pathlib.Path(__file__).resolve().parent / "demo"
VOCABULARY_FILE = DEMO_DIR / "sentencepiece.model"
# Pieces of the demo vocabulary. A ~10M-parameter model on 2 CPU cores spends
# a large share of each decoder position on the [emb, vocab] logits matmul,
# and the draft spends most of its step there. On Multi30k 4000 pieces cost
# 9% more German tokens than 8000 (17.4 vs 15.9 a sentence on val) for half
# the logits: cheaper per sentence for the target and much cheaper for the
# draft. Unknown pieces: none on Multi30k (character coverage 1.0), 24 in
# WMT21's German references (characters Multi30k lacks).
NUM_PIECES = 4000
# T5 reserves 100 extra ids (sentinels); 96 makes the vocabulary 4096 = 32 *
# 128, a multiple of 128 as T5 pads its own to (32128).
EXTRA_IDS = 96
# T5's public vocabulary (cc_all.32000 with 100 extra ids), for the TFDS tasks
# that public checkpoints are evaluated on.
T5_VOCABULARY_FILE = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
T5_EXTRA_IDS = 100

TRANSLATE_PREFIX = "translate English to German: "
SUMMARIZE_PREFIX = "summarize: "

MULTI30K = "multi30k_en_de"
WMT21 = "wmt21_en_de"
WMT_T2T = "wmt_t2t_en_de"
CNN_DAILYMAIL = "cnn_dailymail"

# Multi30k's raw files, shipped (see demo/PROVENANCE.md).
_MULTI30K = DEMO_DIR / "multi30k"
# Split name -> file stem of Multi30k's raw files.
_MULTI30K_STEMS = {
    "train": "train",
    "validation": "val",
    "test": "test_2016_flickr",
}
_WMT21_FILES = (
    DEMO_DIR / "wmt" / "newstest2021.en-de.src.en",
    DEMO_DIR / "wmt" / "newstest2021.en-de.ref.A.de",
)


def vocabulary(path=VOCABULARY_FILE, extra_ids=EXTRA_IDS):
  """The demo vocabulary (default) or another SentencePiece model.

  Args:
    path: a SentencePiece .model file.
    extra_ids: extra ids appended after the model's pieces.

  Returns:
    A seqio.SentencePieceVocabulary.
  """
  return seqio.SentencePieceVocabulary(str(path), extra_ids=extra_ids)


def _text_lines(sentences: Iterable[str]) -> Iterator[str]:
  for sentence in sentences:
    yield sentence.rstrip("\n")


def train_vocabulary(sentences, path, num_pieces=NUM_PIECES):
  """Trains a SentencePiece unigram model with T5's special ids.

  Single-threaded, so the same sentences give the same model byte for byte.

  Args:
    sentences: an iterable of str, one sentence each.
    path: where to write the .model file.
    num_pieces: pieces in the model, pad, eos and unk included; extra ids are
      added by `vocabulary`, not stored.
  """
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=_text_lines(sentences),
      model_writer=model,
      vocab_size=num_pieces,
      model_type="unigram",
      pad_id=0,
      eos_id=1,
      unk_id=2,
      bos_id=-1,
      character_coverage=1.0,
      num_threads=1,
      minloglevel=2,
  )
  pathlib.Path(path).write_bytes(model.getvalue())


def vocabulary_sentences(directory=None) -> Iterator[str]:
  """The demo vocabulary's training text: Multi30k train, as the model sees it.

  English lines carry the task's prefix, so that it costs a few pieces rather
  than the 13 that a vocabulary which never saw "translate" splits it into.

  Args:
    directory: see `multi30k_dir`.

  Yields:
    The 29,000 prefixed English sentences, then the 29,000 German ones.
  """
  sources, references = parallel_text(MULTI30K, "train", directory)
  yield from (translation_input(text) for text in sources)
  yield from references


def read_lines(path) -> list[str]:
  """The lines of a text file (gzip if the name ends in .gz), without '\\n'."""
  path = str(path)
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    return f.read().splitlines()


@gin.configurable
def multi30k_dir(directory=None):
  """The directory of Multi30k's {train,val}.{en,de}.gz.

  Args:
    directory: the directory; None means the copy shipped in
      spec_decode/demo/multi30k.

  Returns:
    A pathlib.Path.

  Raises:
    FileNotFoundError: if the directory does not exist.
  """
  path = pathlib.Path(directory) if directory else _MULTI30K
  if not path.is_dir():
    raise FileNotFoundError(
        f"No Multi30k directory at {path}. Download data/task1/raw/ of "
        f"github.com/multi30k/dataset and bind "
        f"multi30k_dir.directory = '<that directory>'."
    )
  return path


def parallel_text(task_name, split, directory=None):
  """The English sources and German references of a local task's split.

  Args:
    task_name: MULTI30K or WMT21.
    split: 'train', 'validation' or 'test' (MULTI30K); 'test' (WMT21).
    directory: Multi30k's train/val directory; None asks `multi30k_dir()`.

  Returns:
    (sources, references): two aligned lists of str.
  """
  if task_name == WMT21 and split == "test":
    files = _WMT21_FILES
  elif task_name == MULTI30K and split in _MULTI30K_STEMS:
    if split == "test":
      directory = _MULTI30K
    else:
      directory = pathlib.Path(directory) if directory else multi30k_dir()
    stem = _MULTI30K_STEMS[split]
    files = (directory / f"{stem}.en.gz", directory / f"{stem}.de.gz")
  else:
    raise ValueError(f"No split {split!r} in local task {task_name!r}.")
  sources, references = (read_lines(f) for f in files)
  if len(sources) != len(references):
    raise ValueError(
        f"{files[0]} has {len(sources)} lines but {files[1]} "
        f"has {len(references)}."
    )
  return sources, references


def _pairs_dataset(sources, targets, shuffle_files, seed):
  """{'en': str, 'de': str} examples; shuffled whole when training."""
  dataset = tf.data.Dataset.from_tensor_slices({"en": sources, "de": targets})
  if shuffle_files:
    dataset = dataset.shuffle(len(sources), seed=seed)
  return dataset


def _local_dataset_fn(task_name, split, shuffle_files, seed=None):
  return _pairs_dataset(*parallel_text(task_name, split), shuffle_files, seed)


def _file_pair_dataset_fn(
    source_file, target_file, split, shuffle_files, seed=None
):
  del split  # One split, 'train'.
  sources, targets = read_lines(source_file), read_lines(target_file)
  if len(sources) != len(targets):
    raise ValueError(
        f"{source_file} has {len(sources)} lines but "
        f"{target_file} has {len(targets)}."
    )
  return _pairs_dataset(sources, targets, shuffle_files, seed)


@seqio.map_over_dataset
def _prefixed_pair(example, source_key, target_key, prefix):
  """Maps {source_key, target_key} to {'inputs': prefix + source, 'targets'}."""
  return {
      "inputs": tf.strings.join([prefix, example[source_key]]),
      "targets": example[target_key],
  }


def translate_en_de(dataset):
  """T5's input format for En->De: 'translate English to German: <en>'."""
  return _prefixed_pair(
      dataset, source_key="en", target_key="de", prefix=TRANSLATE_PREFIX
  )


def summarize_cnn_dailymail(dataset):
  """T5's input format for CNN/DailyMail: 'summarize: <article>'."""
  return _prefixed_pair(
      dataset,
      source_key="article",
      target_key="highlights",
      prefix=SUMMARIZE_PREFIX,
  )


def translation_input(text):
  """The encoder text for one English sentence, as the tasks format it."""
  return TRANSLATE_PREFIX + text


def bleu(targets, predictions):
  """Corpus BLEU of detokenized text, sacrebleu's default (13a) signature.

  Args:
    targets: list of reference str.
    predictions: list of predicted str, aligned with `targets`.

  Returns:
    {'bleu': the score, 0-100}.
  """
  return {"bleu": sacrebleu.corpus_bleu(predictions, [targets]).score}


def output_features(vocab):
  """'inputs' and 'targets', both with `vocab` and an EOS."""
  return {
      "inputs": seqio.Feature(vocab, add_eos=True),
      "targets": seqio.Feature(vocab, add_eos=True),
  }


_TOKENIZE = (
    seqio.preprocessors.tokenize,
    seqio.preprocessors.append_eos_after_trim,
)


def _add_task(name, source, formatter, vocab, metric_fns=()):
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name,
      source=source,
      preprocessors=[formatter, *_TOKENIZE],
      output_features=output_features(vocab),
      metric_fns=list(metric_fns),
  )


@gin.configurable
def distillation_task(
    target_file=gin.REQUIRED, source_file=None, name="distill_en_de"
):
  """Registers an En->De task of a target's outputs, for distilling a draft.

  The draft then learns the target's own distribution, not the references':
  line i of `target_file` is the target model's output (e.g. greedy) for line
  i of `source_file`. Registering again under `name` replaces the task.

  Args:
    target_file: the target model's German output for each line of
      `source_file` (.gz allowed).
    source_file: English sentences, one a line; None means Multi30k's
      train.en.gz in `multi30k_dir()`.
    name: the task's name.

  Returns:
    `name`, with a 'train' split.
  """
  if source_file is None:
    source_file = multi30k_dir() / "train.en.gz"
  source = seqio.FunctionDataSource(
      functools.partial(
          _file_pair_dataset_fn, str(source_file), str(target_file)
      ),
      splits=("train",),
  )
  _add_task(name, source, translate_en_de, vocabulary())
  return name


def _register_tasks():
  """Registers the local tasks and the paper's TFDS tasks."""
  demo_vocab = vocabulary()
  for name, splits in ((MULTI30K, tuple(_MULTI30K_STEMS)), (WMT21, ("test",))):
    source = seqio.FunctionDataSource(
        functools.partial(_local_dataset_fn, name), splits=splits
    )
    _add_task(name, source, translate_en_de, demo_vocab, metric_fns=[bleu])
  t5_vocab = vocabulary(T5_VOCABULARY_FILE, T5_EXTRA_IDS)
  # newstest2013 is validation and newstest2014 test, as in T5 and the paper.
  _add_task(
      WMT_T2T,
      seqio.TfdsDataSource(
          "wmt_t2t_translate/de-en:1.0.0",
          splits=("train", "validation", "test"),
      ),
      translate_en_de,
      t5_vocab,
      metric_fns=[bleu],
  )
  _add_task(
      CNN_DAILYMAIL,
      seqio.TfdsDataSource(
          "cnn_dailymail:3.4.0", splits=("train", "validation", "test")
      ),
      summarize_cnn_dailymail,
      t5_vocab,
  )


def encoder_inputs(texts: Sequence[str], vocab, length):
  """Tokenizes English sentences for the encoder, as the tasks do.

  Args:
    texts: B English sentences.
    vocab: a seqio vocabulary.
    length: S; longer inputs are cut to S - 1 tokens before the EOS.

  Returns:
    int32 [B, S], each row the prefixed sentence's ids, EOS, then padding 0.
  """
  tokens = np.zeros((len(texts), length), np.int32)
  for row, text in enumerate(texts):
    ids = vocab.encode(translation_input(text))[: length - 1]
    ids.append(vocab.eos_id)
    tokens[row, : len(ids)] = ids
  return tokens


_register_tasks()
