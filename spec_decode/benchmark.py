r"""Runs the paper's Table 2 in miniature on the demo pair, gamma 1 to 8.

  python -m spec_decode.benchmark --gin_file=configs/benchmark.gin
  python -m spec_decode.benchmark --gin_file=configs/benchmark_smoke.gin
  python -m spec_decode.benchmark --merge=a/table2.json,b/table2.json \
      --merge_dir=results/benchmark

Prints a line per point, then the Markdown tables; writes them with a JSON of
every point and a plot of speedup against gamma (see spec_decode.table2,
where the logic lives). With --merge it sweeps nothing: it joins the tables of
sweeps run in parts. This app parses flags and gin, and turns bad input, or a
point that fails, into a one-line error.
"""

from absl import flags

from spec_decode import cli

_MERGE = flags.DEFINE_list(
    "merge", None, "table2.json files to join instead of sweeping."
)
_MERGE_DIR = flags.DEFINE_string(
    "merge_dir", None, "Where --merge writes the joined table2.{json,md,png}."
)


def main(argv):
  # Here, after absl has started, and before gin parses the bindings of the
  # sweep. vocabulary first: it imports TensorFlow (which table2 needs,
  # through seqio) quietly.
  # pylint: disable=g-import-not-at-top,unused-import
  from spec_decode import vocabulary
  from spec_decode import table2
  # pylint: enable=g-import-not-at-top,unused-import

  with cli.one_line_errors():
    if _MERGE.value:
      if not _MERGE_DIR.value:
        raise ValueError("--merge needs --merge_dir")
      if cli.GIN_FILES.value or cli.GIN_BINDINGS.value or len(argv) > 1:
        raise ValueError("--merge takes no gin flags and no arguments")
      text = table2.merge(_MERGE.value, _MERGE_DIR.value)
    else:
      cli.start(argv)
      text = table2.sweep(cli.GIN_FILES.value, cli.GIN_BINDINGS.value)
  print(text)


if __name__ == "__main__":
  cli.run(main)
