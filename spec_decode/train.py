r"""Trains a T5 on a seqio task; the logic is in `training.py`.

  python -m spec_decode.train --gin_file=configs/train/multi30k_target.gin \
      [--gin_bindings="NUM_STEPS = 100"]

Checkpoints, metrics (`metrics.jsonl`) and the operative config go to the
gin file's MODEL_DIR; running the same command again resumes from the latest
checkpoint.
"""

from absl import app
from absl import flags
from absl import logging

from spec_decode import cli
from spec_decode import gin_config
from spec_decode import training
from spec_decode.models.config import T5Config


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    # Orbax logs a dozen INFO lines per checkpoint, through the progress bar.
    logging.set_verbosity(logging.WARNING)
  gin_config.parse(cli.GIN_FILES.value, cli.GIN_BINDINGS.value)
  training.train(T5Config())


if __name__ == "__main__":
  app.run(main)
