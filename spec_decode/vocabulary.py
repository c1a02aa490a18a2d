"""seqio vocabularies as gin configurables, under t5x's names.

  VOCABULARY = @seqio.SentencePieceVocabulary()
  seqio.SentencePieceVocabulary.sentencepiece_model_file = 'spm.model'
  seqio.SentencePieceVocabulary.extra_ids = 100

Importing this module imports seqio, and with it TensorFlow.
"""

import contextlib
import os

import gin


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
  import seqio  # pylint: disable=g-import-not-at-top

gin.external_configurable(seqio.SentencePieceVocabulary, module="seqio")
