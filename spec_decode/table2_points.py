"""The points of a Table 2 sweep: its axes, a Point, the grid, and a row's.

A point is one run of the sweep (see `spec_decode.table2`). `check_axes`
checks the sweep's axes before the first point runs; `points` lays out every
point of those axes in sweep order, and `from_row` reads the point back from
a table2.json row, tables made before the verifier and early stop included.
"""

import collections.abc
import dataclasses
import itertools

import seqio

from spec_decode import checks
from spec_decode import compare
from spec_decode import verify


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


def check_axes(
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
  if not all(checks.is_int(v) and v >= 1 for v in batch_sizes):
    raise ValueError(
        f"table2.sweep.batch_sizes must be ints >= 1: {batch_sizes}"
    )
  if not all(g == "auto" or checks.is_int(g) and g >= 1 for g in gammas):
    raise ValueError(
        f"table2.sweep.gammas must be ints >= 1 or 'auto': {gammas}"
    )
  for verifier in verifiers:
    if verifier not in verify.VERIFIERS:
      raise ValueError(
          f"table2.sweep.verifiers: {verifier!r} is not one of "
          f"{verify.VERIFIERS}"
      )
  if not all(checks.is_number(t) and 0 <= t < 1 for t in draft_thresholds):
    raise ValueError(
        f"table2.sweep.draft_thresholds must be in [0, 1): {draft_thresholds}"
    )
  if not all(checks.is_number(t) and t >= 0 for t in temperatures):
    raise ValueError(f"table2.sweep.temperatures must be >= 0: {temperatures}")
  checks.check_count(num_examples, "table2.sweep.num_examples")


# Rows of tables made before the verifier and early stop: token-wise, no stop.
_LEGACY = dict(verifier="token", draft_threshold=0.0)


def from_row(row):
  """The Point of a table2.json row."""
  values = {
      field: row.get(field, _LEGACY.get(field)) for field in _POINT_FIELDS
  }
  if row.get("gamma_policy") == "auto":
    values["gamma"] = "auto"  # The row's gamma is the one it chose.
  return Point(**values)
