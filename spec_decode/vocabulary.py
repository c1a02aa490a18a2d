"""seqio vocabularies as gin configurables, under t5x's names.

  VOCABULARY = @seqio.SentencePieceVocabulary()
  seqio.SentencePieceVocabulary.sentencepiece_model_file = 'spm.model'
  seqio.SentencePieceVocabulary.extra_ids = 100

A Hugging Face T5 checkpoint directory holds its SentencePiece model as
`spiece.model`; with T5's 100 extra ids it gives the same ids as
transformers' `T5Tokenizer` (a test checks this):

  run.vocabulary = @checkpoint_vocabulary()
  checkpoint_vocabulary.path = '~/models/flan-t5-small'

`run.vocabulary` left unset takes the target checkpoint's.

Importing this module imports seqio, and with it TensorFlow.
"""

import contextlib
import os

import gin

from spec_decode.checkpoints import storage


@contextlib.contextmanager
def _quiet_stderr():
  """Silences file descriptor 2: TensorFlow's C++ start-up logs (oneDNN, CUDA
  probes) go there before any setting can turn them off."""
  saved = os.dup(2)
  try:
    with open(os.devnull, "w") as devnull:
      os.dup2(devnull.fileno(), 2)
      yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)


with _quiet_stderr():
  # pylint: disable=g-import-not-at-top
  from google.protobuf import message as protobuf_message
  import seqio
  import tensorflow as tf
  # pylint: enable=g-import-not-at-top

gin.external_configurable(seqio.SentencePieceVocabulary, module="seqio")


# The SentencePiece model's name in a Hugging Face T5 checkpoint directory.
SPIECE = "spiece.model"
# T5's sentinel tokens: every public T5, Flan-T5 and mT5 vocabulary has 100,
# appended after the SentencePiece pieces (<extra_id_0> is the last id).
T5_EXTRA_IDS = 100


def spiece_file(path):
  """The SentencePiece model a checkpoint path names, or None.

  Args:
    path: a `.model` file, or a directory (or a file in one) holding
      `spiece.model`; `~` and environment variables are expanded.

  Returns:
    The model file's path, or None if there is none.
  """
  path = storage.expand(path)
  if os.path.isfile(path) and path.endswith(".model"):
    return path
  directory = path if os.path.isdir(path) else os.path.dirname(path)
  candidate = os.path.join(directory, SPIECE)
  return candidate if os.path.isfile(candidate) else None


@gin.configurable
def checkpoint_vocabulary(path=gin.REQUIRED, extra_ids=T5_EXTRA_IDS):
  """A checkpoint's SentencePiece vocabulary with T5's extra ids, loaded.

  Args:
    path: a Hugging Face checkpoint directory (or a file in it) holding
      `spiece.model`, or a SentencePiece model file; `~` and environment
      variables are expanded.
    extra_ids: sentinel ids appended after the pieces.

  Returns:
    A seqio.SentencePieceVocabulary, loaded.

  Raises:
    ValueError: there is no SentencePiece model at `path`, or it cannot be
      read (one line).
  """
  found = spiece_file(path)
  if found is None:
    raise ValueError(
        f"no vocabulary at {path}: expected a SentencePiece model file or a "
        f"directory holding {SPIECE}; bind run.vocabulary"
    )
  return checked(seqio.SentencePieceVocabulary(found, extra_ids=extra_ids))


def for_run(vocabulary, target_checkpoint):
  """The run's vocabulary, loaded.

  Args:
    vocabulary: run.vocabulary (a seqio.Vocabulary), or None.
    target_checkpoint: the target's checkpoint path (expanded), or None.

  Returns:
    `vocabulary`, or if None the target checkpoint's `spiece.model` with T5's
    extra ids.

  Raises:
    ValueError: neither is there, or the file cannot be read (one line).
  """
  if vocabulary is not None:
    return checked(vocabulary)
  if target_checkpoint is None or spiece_file(target_checkpoint) is None:
    raise ValueError(
        f"run.vocabulary is not set and the target checkpoint "
        f"{target_checkpoint} has no {SPIECE}: bind run.vocabulary"
    )
  return checkpoint_vocabulary(target_checkpoint)


def bound_for_run():
  """`for_run` of run.vocabulary as bound (or unbound) and the target's path.

  For the tools that read a run's gin files without running it
  (`spec_decode.translate`, `spec_decode.alpha`).
  """
  # pylint: disable-next=g-import-not-at-top
  from spec_decode import pair  # Imports jax and flax, as callers do.

  try:
    bound = gin.query_parameter("run.vocabulary").scoped_configurable_fn()
  except ValueError:
    bound = None
  return for_run(bound, pair.bound_checkpoint_path("target"))


def checked(vocabulary):
  """Loads `vocabulary` now, so that a bad file is a one-line ValueError.

  seqio reads a SentencePiece model lazily, on first use, and a missing or
  corrupt file then surfaces as a TensorFlow or protobuf traceback.

  Args:
    vocabulary: a seqio.Vocabulary.

  Returns:
    The same vocabulary, loaded.

  Raises:
    ValueError: its file is missing or is not a SentencePiece model.
  """
  try:
    vocabulary.vocab_size  # pylint: disable=pointless-statement
  except (
      tf.errors.OpError,
      protobuf_message.Error,
      RuntimeError,
      OSError,
  ) as e:
    name = getattr(vocabulary, "sentencepiece_model_file", vocabulary)
    detail = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise ValueError(f"cannot read the vocabulary {name}: {detail}") from e
  return vocabulary
