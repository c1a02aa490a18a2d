r"""Trains a T5 on a seqio task; the loop is in `train_loop.py`.

  python -m spec_decode.train --gin_file=configs/train/multi30k_target.gin \
      [--gin_bindings="NUM_STEPS = 100"]

Checkpoints, metrics (`metrics.jsonl`) and the operative config go to the
gin file's MODEL_DIR; running the same command again resumes from the latest
checkpoint. Bad input ends it with a one-line `error: ...` and exit status 1.
"""

from spec_decode import cli
from spec_decode.models.config import T5Config


def main(argv):
  # Imported once absl has started (as cli.start does with data): TensorFlow
  # logs CUDA probe errors when imported before. Before parsing: it registers
  # `train` with gin.
  # pylint: disable=g-import-not-at-top,unused-import
  from spec_decode import vocabulary  # Imports TensorFlow quietly.
  from spec_decode import train_loop
  # pylint: enable=g-import-not-at-top,unused-import

  with cli.one_line_errors():
    cli.start(argv)
    train_loop.train(T5Config())


if __name__ == "__main__":
  cli.run(main)
