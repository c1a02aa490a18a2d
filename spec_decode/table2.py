"""The paper's Table 2 in miniature: speedups against gamma, and Theorem 3.8.

Leviathan, Kalman & Matias (ICML 2023), Table 2, reports for each task, draft
and temperature the acceptance rate alpha and the measured speedup; section 3
predicts the speedup from alpha and the cost ratio c (Theorem 3.8). `sweep`
runs `compare.run` at every point of

  tasks x temperatures x batch sizes x drafts x verifiers x draft
  thresholds x gammas

(in that order, gamma innermost; gamma may be 'auto', see
`spec_decode.calibration`) and writes to its output_dir:

- points/<point>/: each run's outputs, results and operative config;
- table2.json: the sweep's gin files and bindings; every point's settings,
  results and own bindings; and the best gamma of each (task, temperature,
  batch size, draft), measured and by Theorem 3.8;
- table2.md: the same as Markdown tables (what the benchmark prints);
- table2.png: speedup against gamma, measured (solid) and Theorem 3.8's
  (dashed), one line per draft, one panel per task, temperature and batch
  size.

The three are rewritten after each (task, temperature, batch size, draft),
so a stopped sweep leaves its table so far, and `resume=True` runs only the
points that table lacks. `merge` joins sweeps run in parts (say one task
each) into one table.

A point is a run of `python -m spec_decode.run` with the sweep's files and
bindings, then the point's own (its `bindings` in table2.json), so any point
can be rerun alone.

This module runs the sweep; the rest of Table 2 is in its own modules, and
re-exported here: the points (`table2_points`), each group's best gamma
(`table2_best`), the Markdown report (`table2_markdown`), the plot
(`table2_plot`), and the files written, merged and resumed from
(`table2_files`).
"""

import dataclasses
import hashlib
import time

import gin

from spec_decode import checkpoints
from spec_decode import compare
from spec_decode import data
from spec_decode import engine
from spec_decode import gin_config
from spec_decode import report
from spec_decode import run_outputs
from spec_decode import table2_best
from spec_decode import table2_files
from spec_decode import table2_markdown
from spec_decode import table2_plot
from spec_decode import table2_points

# What a failing point raises: bad input or config, a missing file or
# checkpoint, an XLA error. Anything else is a bug and keeps its traceback.
_POINT_ERRORS = (ValueError, RuntimeError, OSError, checkpoints.CheckpointError)
_NGRAM_DRAFTS = ("unigram", "bigram")

# Table 2 under the names it had before its split into modules.
Point = table2_points.Point
points = table2_points.points
best_gammas = table2_best.best_gammas
markdown = table2_markdown.markdown
plot = table2_plot.plot
write = table2_files.write
merge = table2_files.merge


def _ngram_text(path):
  """The n-gram drafts' corpus as the plain text `compare.run` reads.

  Args:
    path: a text file, one sentence a line (.gz allowed); None means
      Multi30k's German training text, train.de.gz in `data.multi30k_dir()`:
      the text the demo target learned to write.

  Returns:
    The text, one sentence a line.
  """
  source = data.multi30k_dir() / "train.de.gz" if path is None else path
  return "\n".join(data.read_lines(source)) + "\n"


def _bindings(point, tasks, split, num_examples, directory, ngram_corpus):
  """The gin bindings that make a run into `point`: its own, then its task's."""
  point_dir = directory / "points" / point.name
  bindings = [
      f"run.output_dir = {str(point_dir)!r}",
      f"run.draft = {point.draft!r}",
      f"run.gamma = {point.gamma!r}",
      f"run.verifier = {point.verifier!r}",
      f"run.draft_threshold = {float(point.draft_threshold)!r}",
      f"run.temperature = {float(point.temperature)!r}",
      f"run.batch_size = {point.batch_size}",
      "run.progress = False",
      f"read_inputs.task = {point.task!r}",
      f"read_inputs.split = {split!r}",
      f"read_inputs.num_examples = {num_examples}",
  ]
  if point.draft in _NGRAM_DRAFTS:
    bindings.append(f"run.ngram_corpus = {str(ngram_corpus)!r}")
  return bindings + list(tasks[point.task])


def _progress_line(index, total, ran, point, row, elapsed):
  """After point `index` of `total`, the `ran`-th run here (others kept)."""
  left = elapsed / ran * (total - index)
  return (
      f"[{index}/{total}] {point}: alpha {row['alpha']:.3f}, "
      f"{row['tokens_per_target_call']:.2f} tokens/call, speedup "
      f"{row['speedup']:.2f}x (Theorem 3.8: "
      f"{row['predicted_speedup']:.2f}x), {row['seconds']:.0f} s; "
      f"{elapsed / 60:.1f} min elapsed, about {left / 60:.0f} min left"
  )


@gin.configurable
def sweep(
    files,
    bindings,
    output_dir=gin.REQUIRED,
    tasks=gin.REQUIRED,
    drafts=("t5", "bigram", "unigram"),
    temperatures=(0.0, 1.0),
    gammas=tuple(range(1, 9)),
    batch_sizes=(1, 8),
    verifiers=("block",),
    draft_thresholds=(0.0,),
    num_examples=24,
    split="test",
    ngram_corpus=None,
    progress=True,
    resume=False,
):
  """Runs `compare.run` at every point and writes Table 2's outputs.

  Args:
    files: the gin files of every run (e.g. configs/benchmark.gin).
    bindings: gin bindings applied after `files`, before each point's own.
    output_dir: where the outputs go (see the module docstring).
    tasks: {seqio task name: extra gin bindings for its runs}, e.g.
      {'wmt21_en_de': ['run.max_input_len = 192']}; a task's bindings come
      last, so they may override the point's.
    drafts: `compare.DRAFT_KINDS` kinds.
    temperatures: sampling temperatures; 0 is greedy.
    gammas: tokens drafted per target call, or 'auto'.
    batch_sizes: rows per decoder call.
    verifiers: 'block', 'token'.
    draft_thresholds: early-stop thresholds in [0, 1); 0 does not stop.
    num_examples: the first this many inputs of each task's split.
    split: the tasks' split.
    ngram_corpus: the text the unigram and bigram drafts are counted over, one
      sentence a line (.gz allowed); None means Multi30k's German training
      text (train.de.gz in `multi30k_dir.directory`).
    progress: print a line after each point.
    resume: keep the points of the table2.json already in output_dir (a
      stopped or smaller sweep's) whose own bindings are unchanged, and run
      the rest. That table must have the same gin files, the same bindings
      (other than table2.sweep's) and the same n-gram corpus.

  Returns:
    The Markdown report, also written to output_dir/table2.md.

  Raises:
    ValueError: on a bad axis, or a table to resume from another setting.
    RuntimeError: when a point fails, with a one-line message naming it.
  """
  for name, value in (("resume", resume), ("progress", progress)):
    if not isinstance(value, bool):
      raise ValueError(
          f"table2.sweep.{name} must be True or False, got {value!r}"
      )
  table2_points.check_axes(
      tasks,
      drafts,
      temperatures,
      gammas,
      batch_sizes,
      num_examples,
      verifiers,
      draft_thresholds,
  )
  directory = run_outputs.make_writable_dir(
      output_dir, "table2.sweep.output_dir"
  )
  corpus, corpus_sha256, earlier = _corpus_and_earlier(
      directory, files, bindings, drafts, ngram_corpus, resume
  )
  todo = table2_points.points(
      tasks,
      temperatures,
      batch_sizes,
      drafts,
      gammas,
      verifiers,
      draft_thresholds,
  )
  rows = _run_points(
      todo,
      directory,
      files,
      bindings,
      tasks=tasks,
      split=split,
      num_examples=num_examples,
      corpus=corpus,
      corpus_sha256=corpus_sha256,
      earlier=earlier,
      progress=progress,
  )
  return write(
      directory,
      table2_files.sweep_json(files, bindings, corpus_sha256, rows),
  )


def _corpus_and_earlier(
    directory, files, bindings, drafts, ngram_corpus, resume
):
  """The n-gram corpus, written to directory, and the points to resume from.

  Args:
    directory: the sweep's output_dir.
    files: the sweep's gin files.
    bindings: the sweep's gin bindings.
    drafts: the sweep's drafts; without n-gram ones, there is no corpus.
    ngram_corpus: `sweep`'s ngram_corpus.
    resume: `sweep`'s resume.

  Returns:
    (the corpus file or None, its text's SHA-256 or None, the points of the
    table2.json to resume from, by Point: none without `resume`).

  Raises:
    ValueError: when that table was run with another setting; the corpus
      is then left as it was.
  """
  corpus, text, corpus_sha256 = None, None, None
  if any(draft in _NGRAM_DRAFTS for draft in drafts):
    text = _ngram_text(ngram_corpus)
    corpus_sha256 = hashlib.sha256(text.encode()).hexdigest()
  earlier = {}
  if resume:
    earlier = table2_files.earlier_rows(
        directory, files, bindings, corpus_sha256
    )
  if text is not None:
    corpus = directory / "ngram_corpus.txt"
    corpus.write_text(text)
  return corpus, corpus_sha256, earlier


def _run_points(
    todo,
    directory,
    files,
    bindings,
    *,
    tasks,
    split,
    num_examples,
    corpus,
    corpus_sha256,
    earlier,
    progress,
):
  """Runs each point of `todo` in turn, or keeps its earlier row.

  Before each new (task, temperature, batch size, draft), writes the table so
  far. The arguments are `sweep`'s and `_corpus_and_earlier`'s.

  Returns:
    The points' rows, in `todo`'s order.
  """
  rows = []
  start = time.perf_counter()
  ran = 0
  group = None
  for index, point in enumerate(todo, 1):
    # A new (task, temperature, batch, draft): write the table so far (a
    # stopped sweep leaves it) and free the last group's programs.
    if dataclasses.replace(point, gamma=0) != group:
      if rows:
        write(
            directory,
            table2_files.sweep_json(files, bindings, corpus_sha256, rows),
        )
      group = dataclasses.replace(point, gamma=0)
      engine.clear_compiled()
    point_bindings = _bindings(
        point, tasks, split, num_examples, directory, corpus
    )
    if point in earlier and earlier[point]["bindings"] == point_bindings:
      rows.append(earlier[point])
      if progress:
        print(f"[{index}/{len(todo)}] {point}: kept", flush=True)
      continue
    label = f"{index}/{len(todo)} ({point})"
    rows.append(
        _run_point(point, split, files, bindings, point_bindings, label)
    )
    ran += 1
    if progress:
      elapsed = time.perf_counter() - start
      print(
          _progress_line(index, len(todo), ran, point, rows[-1], elapsed),
          flush=True,
      )
  return rows


def _run_point(point, split, files, bindings, point_bindings, label):
  """Runs one point: `compare.run` under the sweep's and its own bindings.

  Args:
    point: the Point.
    split: the tasks' split.
    files: the sweep's gin files.
    bindings: the sweep's gin bindings.
    point_bindings: the point's own (`_bindings`).
    label: the point in a failure's message, e.g. '3/8 (multi30k_en_de, ...)'.

  Returns:
    Its row of table2.json: the point, the split, the results of
    `compare.run`, the seconds it took and the point's bindings.

  Raises:
    RuntimeError: when the point fails, with a one-line message naming it.
  """
  point_start = time.perf_counter()
  try:
    gin_config.parse(files, [*bindings, *point_bindings])
    results = compare.run()
  except _POINT_ERRORS as e:
    raise RuntimeError(f"point {label}: {report.one_line(e)}") from e
  seconds = time.perf_counter() - point_start
  return dict(
      dataclasses.asdict(point),
      split=split,
      **results,
      seconds=seconds,
      bindings=point_bindings,
  )
