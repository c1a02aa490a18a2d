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
"""

import collections.abc
import dataclasses
import hashlib
import itertools
import json
import pathlib
import statistics
import time

import gin
from matplotlib import figure
from matplotlib import lines as mlines
from matplotlib import ticker
import seqio

from spec_decode import analysis
from spec_decode import checkpoints
from spec_decode import compare
from spec_decode import data
from spec_decode import engine
from spec_decode import gin_config
from spec_decode import report
from spec_decode import verify

# What a failing point raises: bad input or config, a missing file or
# checkpoint, an XLA error. Anything else is a bug and keeps its traceback.
_POINT_ERRORS = (ValueError, RuntimeError, OSError, checkpoints.CheckpointError)
_NGRAM_DRAFTS = ("unigram", "bigram")


@dataclasses.dataclass(frozen=True)
class Point:
  """One run of the sweep.

  Attributes:
    task: a registered seqio task.
    temperature: 0 is greedy.
    batch_size: rows per decoder call.
    draft: a `compare.DRAFT_KINDS` kind.
    gamma: tokens drafted per target call (the most, with a draft
      threshold), or 'auto'.
    verifier: 'block' or 'token'.
    draft_threshold: the early stop's threshold; 0 drafts gamma tokens.
  """

  task: str
  temperature: float
  batch_size: int
  draft: str
  gamma: int | str
  verifier: str = "block"
  draft_threshold: float = 0.0

  @property
  def name(self):
    """A directory name: 'multi30k_en_de-T0-b1-t5-g4' (-token, -s0.5 when
    not the default verifier and threshold)."""
    policy = "" if self.verifier == "block" else f"-{self.verifier}"
    policy += f"-s{self.draft_threshold:g}" if self.draft_threshold else ""
    return (
        f"{self.task}-T{self.temperature:g}-b{self.batch_size}-"
        f"{self.draft}{policy}-g{self.gamma}"
    )

  def __str__(self):
    policy = "" if self.verifier == "block" else f", {self.verifier} verifier"
    if self.draft_threshold:
      policy += f", early stop below {self.draft_threshold:g}"
    return (
        f"{self.task}, temperature {self.temperature:g}, batch "
        f"{self.batch_size}, {self.draft} draft{policy}, gamma {self.gamma}"
    )


_POINT_FIELDS = tuple(field.name for field in dataclasses.fields(Point))


def points(
    tasks,
    temperatures,
    batch_sizes,
    drafts,
    gammas,
    verifiers=("block",),
    draft_thresholds=(0.0,),
):
  """Every point of the sweep, gamma varying fastest."""
  return [
      Point(task, temperature, batch, draft, gamma, verifier, threshold)
      for task, temperature, batch, draft, verifier, threshold, gamma in (
          itertools.product(
              tasks,
              temperatures,
              batch_sizes,
              drafts,
              verifiers,
              draft_thresholds,
              gammas,
          )
      )
  ]


def _check_axes(
    tasks,
    drafts,
    temperatures,
    gammas,
    batch_sizes,
    num_examples,
    verifiers=("block",),
    draft_thresholds=(0.0,),
):
  """Fails before the first point, not an hour in, on a bad axis."""
  axes = dict(
      tasks=tasks,
      drafts=drafts,
      temperatures=temperatures,
      gammas=gammas,
      batch_sizes=batch_sizes,
      verifiers=verifiers,
      draft_thresholds=draft_thresholds,
  )
  for name, values in axes.items():
    if not values:
      raise ValueError(f"table2.sweep.{name} is empty")
  if not isinstance(tasks, collections.abc.Mapping):
    raise ValueError(
        "table2.sweep.tasks must map each task to its extra bindings, e.g. "
        f"{{'multi30k_en_de': []}}; got {tasks!r}"
    )
  for task in tasks:
    if task not in seqio.TaskRegistry.names():
      raise ValueError(f"table2.sweep.tasks: no seqio task {task!r}")
  for draft in drafts:
    if draft not in compare.DRAFT_KINDS:
      raise ValueError(
          f"table2.sweep.drafts: {draft!r} is not one of {compare.DRAFT_KINDS}"
      )
  if not all(isinstance(v, int) and v >= 1 for v in batch_sizes):
    raise ValueError(
        f"table2.sweep.batch_sizes must be ints >= 1: {batch_sizes}"
    )
  if not all(g == "auto" or isinstance(g, int) and g >= 1 for g in gammas):
    raise ValueError(
        f"table2.sweep.gammas must be ints >= 1 or 'auto': {gammas}"
    )
  for verifier in verifiers:
    if verifier not in verify.VERIFIERS:
      raise ValueError(
          f"table2.sweep.verifiers: {verifier!r} is not one of "
          f"{verify.VERIFIERS}"
      )
  if not all(0 <= t < 1 for t in draft_thresholds):
    raise ValueError(
        f"table2.sweep.draft_thresholds must be in [0, 1): {draft_thresholds}"
    )
  if not all(t >= 0 for t in temperatures):
    raise ValueError(f"table2.sweep.temperatures must be >= 0: {temperatures}")
  if not isinstance(num_examples, int) or num_examples < 1:
    raise ValueError(
        f"table2.sweep.num_examples must be an int >= 1, got {num_examples!r}"
    )


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


def _bindings(point, split, num_examples, point_dir, ngram_corpus):
  """The gin bindings that make a run into `point`."""
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
  return bindings


def _progress_line(index, total, ran, point, results, seconds, elapsed):
  """After point `index` of `total`, the `ran`-th run here (others kept)."""
  left = elapsed / ran * (total - index)
  return (
      f"[{index}/{total}] {point}: alpha {results['alpha']:.3f}, "
      f"{results['tokens_per_target_call']:.2f} tokens/call, speedup "
      f"{results['speedup']:.2f}x (Theorem 3.8: "
      f"{results['predicted_speedup']:.2f}x), {seconds:.0f} s; "
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
  _check_axes(
      tasks,
      drafts,
      temperatures,
      gammas,
      batch_sizes,
      num_examples,
      verifiers,
      draft_thresholds,
  )
  directory = pathlib.Path(output_dir)
  directory.mkdir(parents=True, exist_ok=True)
  corpus, text, corpus_sha256 = None, None, None
  if any(draft in _NGRAM_DRAFTS for draft in drafts):
    text = _ngram_text(ngram_corpus)
    corpus_sha256 = hashlib.sha256(text.encode()).hexdigest()
  earlier = {}
  if resume:
    earlier = _earlier_rows(directory, files, bindings, corpus_sha256)
  if text is not None:
    corpus = directory / "ngram_corpus.txt"
    corpus.write_text(text)
  todo = points(
      tasks,
      temperatures,
      batch_sizes,
      drafts,
      gammas,
      verifiers,
      draft_thresholds,
  )
  rows = []
  start = time.perf_counter()
  ran = 0
  group = None
  for index, point in enumerate(todo, 1):
    # A new (task, temperature, batch, draft): write the table so far (a
    # stopped sweep leaves it) and free the last group's programs.
    if dataclasses.replace(point, gamma=0) != group:
      if rows:
        write(directory, _sweep_json(files, bindings, corpus_sha256, rows))
      group = dataclasses.replace(point, gamma=0)
      engine.clear_compiled()
    point_bindings = _bindings(
        point, split, num_examples, directory / "points" / point.name, corpus
    )
    point_bindings += list(tasks[point.task])
    if point in earlier and earlier[point]["bindings"] == point_bindings:
      rows.append(earlier[point])
      if progress:
        print(f"[{index}/{len(todo)}] {point}: kept", flush=True)
      continue
    point_start = time.perf_counter()
    try:
      gin_config.parse(files, [*bindings, *point_bindings])
      results = compare.run()
    except _POINT_ERRORS as e:
      raise RuntimeError(
          f"point {index}/{len(todo)} ({point}): {report.one_line(e)}"
      ) from e
    seconds = time.perf_counter() - point_start
    ran += 1
    rows.append(
        dict(
            dataclasses.asdict(point),
            split=split,
            **results,
            seconds=seconds,
            bindings=point_bindings,
        )
    )
    if progress:
      elapsed = time.perf_counter() - start
      print(
          _progress_line(
              index, len(todo), ran, point, results, seconds, elapsed
          ),
          flush=True,
      )
  return write(directory, _sweep_json(files, bindings, corpus_sha256, rows))


def _run_bindings(bindings):
  """The sweep's bindings that reach its runs: all but table2.sweep's."""
  return [b for b in bindings if not b.lstrip().startswith("table2.")]


def _earlier_rows(directory, files, bindings, corpus_sha256):
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
  return {_point(row): row for row in everything["points"]}


# Rows of tables made before the verifier and early stop: token-wise, no stop.
_LEGACY = dict(verifier="token", draft_threshold=0.0)


def _point(row):
  values = {
      field: row.get(field, _LEGACY.get(field)) for field in _POINT_FIELDS
  }
  if row.get("gamma_policy") == "auto":
    values["gamma"] = "auto"  # The row's gamma is the one it chose.
  return Point(**values)


def _gamma_text(gamma, policy):
  return f"auto ({gamma})" if policy == "auto" else str(gamma)


def _sweep_json(files, bindings, corpus_sha256, rows):
  return dict(
      files=[str(file) for file in files],
      bindings=list(bindings),
      ngram_corpus_sha256=corpus_sha256,
      points=rows,
      best_gammas=best_gammas(rows),
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
  text = markdown(rows, everything["best_gammas"])
  (directory / "table2.md").write_text(text)
  plot(rows, directory / "table2.png")
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
      point = _point(row)
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
      directory, dict(parts=parts, points=rows, best_gammas=best_gammas(rows))
  )


def _groups(rows):
  """Rows grouped by (task, temperature, batch size, draft, verifier, draft
  threshold), in sweep order."""
  groups = {}
  for row in rows:
    point = _point(row)
    key = dataclasses.astuple(dataclasses.replace(point, gamma=0))
    groups.setdefault(key[:4] + key[5:], []).append(row)
  return groups


def best_gammas(rows):
  """The best gamma of each (task, temperature, batch size, draft).

  Args:
    rows: the sweep's points (`sweep`'s table2.json 'points').

  Returns:
    One dict per group: its mean alpha and median c over its gammas; the
    swept gamma with the highest measured speedup (and what its measured
    call costs allow), and the one with the highest Theorem 3.8 speedup;
    and Theorem 3.8's optimal gamma in 1..64 at the mean alpha and median c
    (`analysis.optimal_gamma`).
  """
  best = []
  for key, group in _groups(rows).items():
    task, temperature, batch_size, draft, verifier, draft_threshold = key
    alpha = statistics.mean(row["alpha"] for row in group)
    c = statistics.median(row["c"] for row in group)
    measured = max(group, key=lambda row: row["speedup"])
    calls = _call_cost_speedup(measured)
    predicted = max(group, key=lambda row: row["predicted_speedup"])
    best.append(
        dict(
            task=task,
            temperature=temperature,
            batch_size=batch_size,
            draft=draft,
            verifier=verifier,
            draft_threshold=draft_threshold,
            alpha=alpha,
            c=c,
            measured_gamma=measured["gamma"],
            measured_gamma_policy=measured.get("gamma_policy", "fixed"),
            measured_speedup=measured["speedup"],
            call_cost_speedup=calls,
            predicted_gamma=predicted["gamma"],
            predicted_speedup=predicted["predicted_speedup"],
            optimal_gamma=analysis.optimal_gamma(alpha, c),
        )
    )
  return best


def _call_cost_speedup(row):
  """What the point's measured call costs allow (`analysis`)."""
  return analysis.call_cost_speedup(
      row["tokens_per_target_call"],
      row["gamma"],
      row["target_step_ms"],
      row["target_verify_ms"],
      row["draft_step_ms"],
  )


def _verifier_text(verifier, draft_threshold):
  if draft_threshold:
    return f"{verifier}, stop < {draft_threshold:g}"
  return verifier


def _table(header, rows):
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(row) + " |" for row in rows]
  return "\n".join(lines)


def markdown(rows, best):
  """The report: a row per point, then each group's best gamma."""
  points_table = _table(
      (
          "task",
          "T",
          "batch",
          "draft",
          "gamma",
          "verifier",
          "alpha",
          "tokens / call",
          "speedup",
          "Thm 3.8",
          "call costs",
          "c",
          "Thm 3.8 optimal gamma",
      ),
      [
          (
              row["task"],
              f"{row['temperature']:g}",
              str(row["batch_size"]),
              row["draft"],
              _gamma_text(row["gamma"], row.get("gamma_policy")),
              _verifier_text(_point(row).verifier, _point(row).draft_threshold),
              f"{row['alpha']:.3f}",
              f"{row['tokens_per_target_call']:.2f}",
              f"{row['speedup']:.2f}x",
              f"{row['predicted_speedup']:.2f}x",
              f"{_call_cost_speedup(row):.2f}x",
              f"{row['c']:.3f}",
              str(row["optimal_gamma"]),
          )
          for row in rows
      ],
  )
  best_table = _table(
      (
          "task",
          "T",
          "batch",
          "draft",
          "verifier",
          "mean alpha",
          "median c",
          "best gamma, measured",
          "call costs there",
          "best swept gamma, Thm 3.8",
          "Thm 3.8 optimal gamma",
      ),
      [
          (
              group["task"],
              f"{group['temperature']:g}",
              str(group["batch_size"]),
              group["draft"],
              _verifier_text(group["verifier"], group["draft_threshold"]),
              f"{group['alpha']:.3f}",
              f"{group['c']:.3f}",
              _gamma_text(
                  group["measured_gamma"], group["measured_gamma_policy"]
              )
              + f" ({group['measured_speedup']:.2f}x)",
              f"{group['call_cost_speedup']:.2f}x",
              f"{group['predicted_gamma']} "
              f"({group['predicted_speedup']:.2f}x)",
              str(group["optimal_gamma"]),
          )
          for group in best
      ],
  )
  greedy = [row["mismatches"] for row in rows if row["mismatches"] is not None]
  examples = sorted({row["num_examples"] for row in rows})
  return (
      "## Every point\n\n"
      f"{points_table}\n\n"
      f"Inputs per point: {', '.join(map(str, examples))}. Greedy rows "
      f"differing from the baseline: {sum(greedy)} over {len(greedy)} greedy "
      "points.\n\n"
      "## Best gamma: measured and Theorem 3.8\n\n"
      f"{best_table}\n\n"
      "Theorem 3.8's optimal gamma (in 1..64) is at the group's mean alpha "
      "and median c. 'Call costs' is Theorem 3.8 with the point's measured "
      "(gamma+1)-token target call in place of one step and its measured "
      "tokens per call: what a loop that adds no time of its own would "
      "reach.\n"
  )


def plot(rows, path):
  """Speedup against gamma: a panel per task x temperature x batch size.

  Args:
    rows: the sweep's points.
    path: the PNG to write.
  """
  tasks = list(dict.fromkeys(row["task"] for row in rows))
  settings = list(
      dict.fromkeys((row["temperature"], row["batch_size"]) for row in rows)
  )
  drafts = list(dict.fromkeys(row["draft"] for row in rows))
  colors = {draft: f"C{i}" for i, draft in enumerate(drafts)}
  # Wide enough for the legend under a single panel.
  fig = figure.Figure(
      figsize=(max(3.2 * len(settings), 5.5), 2.8 * len(tasks) + 0.8),
      layout="constrained",
  )
  axes = fig.subplots(len(tasks), len(settings), squeeze=False, sharey=True)
  groups = _groups(rows)
  for key, group in groups.items():
    task, temperature, batch_size, draft = key[:4]
    # 'auto' points stand apart from the sweep over gamma.
    group = [row for row in group if row.get("gamma_policy") != "auto"]
    ax = axes[tasks.index(task), settings.index((temperature, batch_size))]
    gammas = [row["gamma"] for row in group]
    ax.plot(
        gammas,
        [row["speedup"] for row in group],
        color=colors[draft],
        marker="o",
        markersize=3,
    )
    ax.plot(
        gammas,
        [row["predicted_speedup"] for row in group],
        color=colors[draft],
        linestyle="--",
    )
  for (task, (temperature, batch_size)), ax in zip(
      itertools.product(tasks, settings), axes.flat
  ):
    ax.axhline(1.0, color="0.6", linewidth=0.8, linestyle=":")
    ax.set_title(f"{task}, T={temperature:g}, batch {batch_size}", fontsize=9)
    ax.set_xlabel("gamma")
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
  for ax in axes[:, 0]:
    ax.set_ylabel("speedup")
  handles = [
      mlines.Line2D([], [], color=colors[draft], label=f"{draft} draft")
      for draft in drafts
  ] + [
      mlines.Line2D([], [], color="k", label="measured"),
      mlines.Line2D([], [], color="k", linestyle="--", label="Theorem 3.8"),
  ]
  fig.legend(
      handles=handles, loc="outside lower center", ncols=max(len(drafts), 2)
  )
  fig.savefig(path, dpi=120)
