r"""Rebuilds the demo vocabulary from Multi30k's training text.

  python scripts/train_vocab.py [--multi30k_dir=DIR] [--output=PATH]

The prefixed English inputs and the German targets together (2 x 29,000),
with T5's special ids; see `spec_decode.data.train_vocabulary`. The result is
byte-identical to the shipped spec_decode/demo/sentencepiece.model.
"""

from absl import app
from absl import flags

from spec_decode import data

_MULTI30K_DIR = flags.DEFINE_string(
    "multi30k_dir",
    None,
    "Directory of Multi30k's train.{en,de}.gz; default: the package's copy.",
)
_OUTPUT = flags.DEFINE_string(
    "output", str(data.VOCABULARY_FILE), "Where to write the .model file."
)
_NUM_PIECES = flags.DEFINE_integer(
    "num_pieces", data.NUM_PIECES, "SentencePiece pieces, specials included."
)


def main(argv):
  del argv
  data.train_vocabulary(
      data.vocabulary_sentences(_MULTI30K_DIR.value),
      _OUTPUT.value,
      _NUM_PIECES.value,
  )


if __name__ == "__main__":
  app.run(main)
