r"""Runs the paper's Table 2 in miniature on the demo pair, gamma 1 to 8.

  python -m spec_decode.benchmark --gin_file=configs/benchmark.gin
  python -m spec_decode.benchmark --gin_file=configs/benchmark_smoke.gin

Prints a line per point, then the Markdown tables; writes them with a JSON of
every point and a plot of speedup against gamma (see spec_decode.table2,
where the logic lives). This app parses flags and gin, and turns bad input,
or a point that fails, into a one-line error.
"""

import sys

from absl import app
from absl import flags
from absl import logging

from spec_decode import checkpoints
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
  # Imported after absl has started, as in run.py: TensorFlow's CUDA probe
  # logs an error when imported before it. vocabulary registers seqio's
  # vocabularies with gin; table2 imports data, which registers the tasks.
  # pylint: disable=g-import-not-at-top,unused-import
  from spec_decode import vocabulary
  from spec_decode import table2
  # pylint: enable=g-import-not-at-top,unused-import

  try:
    gin_config.parse(_GIN_FILES.value, _GIN_BINDINGS.value)
    text = table2.sweep(_GIN_FILES.value, _GIN_BINDINGS.value)
  except (ValueError, RuntimeError, OSError, checkpoints.CheckpointError) as e:
    print(f"error: {report.one_line(e)}", file=sys.stderr)
    sys.exit(1)
  print(text)


if __name__ == "__main__":
  app.run(main)
