r"""Runs the baseline and the speculative decoder and reports what the paper
measures (alpha, tokens per target call, speedup, c, Theorem 3.8).

  python -m spec_decode.run --gin_file=configs/demo.gin
  python -m spec_decode.run --gin_file=configs/t5_1_1_xxl_small_ende.gin \
      --gin_bindings="run.output_dir='/tmp/ende'"

The logic lives in spec_decode.compare; this app parses flags and gin, and
turns bad input into a one-line error.
"""

import sys

from absl import app
from absl import flags
from absl import logging
import jax

from spec_decode import checkpoints
from spec_decode import compare
from spec_decode import distributed
from spec_decode import gin_config
from spec_decode import report

_GIN_FILES = flags.DEFINE_multi_string(
    "gin_file", [], "Gin files, searched for under configs/ too."
)
_GIN_BINDINGS = flags.DEFINE_multi_string(
    "gin_bindings", [], "Gin bindings, applied after the files."
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # Keep the report readable: JAX logs backend probing at INFO.
  logging.set_verbosity(logging.WARNING)
  # Register seqio's vocabularies with gin and the seqio tasks. Imported
  # here, after absl has started, because TensorFlow's CUDA probe logs an
  # error when imported before it; vocabulary imports TensorFlow quietly.
  # pylint: disable=g-import-not-at-top,unused-import
  from spec_decode import vocabulary
  from spec_decode import data
  # pylint: enable=g-import-not-at-top,unused-import

  try:
    gin_config.parse(_GIN_FILES.value, _GIN_BINDINGS.value)
    distributed.initialize_distributed()
    results = compare.run()
  except (ValueError, RuntimeError, OSError, checkpoints.CheckpointError) as e:
    print(f"error: {report.one_line(e)}", file=sys.stderr)
    sys.exit(1)
  if jax.process_index() == 0:
    print(report.format_results(results))


if __name__ == "__main__":
  app.run(main)
