"""A Table 2's files: table2.{json,md,png}, written, merged and resumed from.

`write` writes the three from table2.json's content; `sweep_json` makes that
content for a sweep, `merge` joins several sweeps' into one table, and
`earlier_rows` reads a table back for a sweep to resume from.
"""

import json
import pathlib

from spec_decode import table2_best
from spec_decode import table2_markdown
from spec_decode import table2_plot
from spec_decode import table2_points


def _run_bindings(bindings):
  """The sweep's bindings that reach its runs: all but table2.sweep's."""
  return [b for b in bindings if not b.lstrip().startswith("table2.")]


def earlier_rows(directory, files, bindings, corpus_sha256):
  """The points of directory's table2.json, by Point, to resume from."""
  path = directory / "table2.json"
  if not path.exists():
    return {}
  everything = json.loads(path.read_text())
  same_gin = everything.get("files") == [str(file) for file in files] and (
      _run_bindings(everything.get("bindings", ())) == _run_bindings(bindings)
  )
  # A sweep without n-gram drafts has no corpus to compare.
  corpora = {everything.get("ngram_corpus_sha256"), corpus_sha256} - {None}
  if not same_gin or len(corpora) > 1:
    raise ValueError(
        f"cannot resume from {path}: it was run with other gin files, "
        "bindings or n-gram corpus"
    )
  return {table2_points.from_row(row): row for row in everything["points"]}


def sweep_json(files, bindings, corpus_sha256, rows):
  """A sweep's table2.json content."""
  return dict(
      files=[str(file) for file in files],
      bindings=list(bindings),
      ngram_corpus_sha256=corpus_sha256,
      points=rows,
      best_gammas=table2_best.best_gammas(rows),
  )


def write(directory, everything):
  """Writes table2.json, table2.md and table2.png of a sweep or a merge.

  Args:
    directory: where they go.
    everything: table2.json's content; its 'points' make the table and plot.

  Returns:
    The Markdown report.
  """
  (directory / "table2.json").write_text(
      json.dumps(everything, indent=2) + "\n"
  )
  rows = everything["points"]
  text = table2_markdown.markdown(rows, everything["best_gammas"])
  (directory / "table2.md").write_text(text)
  table2_plot.plot(rows, directory / "table2.png")
  return text


def merge(paths, output_dir):
  """Joins the points of several sweeps (or merges) into one Table 2.

  For a sweep run in parts, e.g. one task at a time. Each part's gin files
  and bindings are kept under 'parts' in the merged table2.json, with its
  path and point count; the points keep their order, part by part.

  Args:
    paths: table2.json files written by `sweep` or `merge`.
    output_dir: where the merged table2.{json,md,png} go.

  Returns:
    The Markdown report.

  Raises:
    ValueError: when a part has no points, or two hold the same point.
  """
  parts, rows, seen = [], [], {}
  for path in paths:
    everything = json.loads(pathlib.Path(path).read_text())
    if not isinstance(everything, dict) or not everything.get("points"):
      raise ValueError(f"{path} has no Table 2 points")
    for row in everything["points"]:
      point = table2_points.from_row(row)
      if point in seen:
        raise ValueError(f"{point} is in both {seen[point]} and {path}")
      seen[point] = path
    rows += everything["points"]
    parts += everything.get("parts") or [
        dict(
            source=str(path),
            files=everything["files"],
            bindings=everything["bindings"],
            num_points=len(everything["points"]),
        )
    ]
  directory = pathlib.Path(output_dir)
  directory.mkdir(parents=True, exist_ok=True)
  return write(
      directory,
      dict(parts=parts, points=rows, best_gammas=table2_best.best_gammas(rows)),
  )
