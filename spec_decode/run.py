r"""Runs the baseline and the speculative decoder and reports what the paper
measures (alpha, tokens per target call, speedup, c, Theorem 3.8).

  python -m spec_decode.run --gin_file=configs/demo.gin
  python -m spec_decode.run --gin_file=configs/t5_1_1_xxl_small_ende.gin \
      --gin_bindings="run.output_dir='/tmp/ende'"

The logic lives in spec_decode.compare; this app parses flags and gin, and
turns bad input into a one-line error.
"""

import jax

from spec_decode import cli
from spec_decode import compare
from spec_decode import report


def main(argv):
  with cli.one_line_errors():
    cli.start(argv)
    results = compare.run()
  if jax.process_index() == 0:
    print(report.format_results(results))


if __name__ == "__main__":
  cli.run(main)
