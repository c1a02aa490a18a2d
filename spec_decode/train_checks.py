"""train's settings, checked before any work.

A bad count, length, seed, optimizer or export setting would otherwise fail
at the first step, and a missing evaluation split or an existing export
directory after eval_every steps, or after the last.
"""

import os

import optax
import seqio

from spec_decode import checks

_EXPORT_DTYPES = ("float32", "bfloat16")
_FEATURES = ("inputs", "targets")


def check_splits(task, eval_task, eval_split):
  """The splits train reads exist: evaluation comes after eval_every steps."""
  for name, split in ((task, "train"), (eval_task or task, eval_split)):
    splits = seqio.get_mixture_or_task(name).splits
    if split is not None and split not in splits:
      raise ValueError(
          f"seqio task {name} has no split {split!r} (it has "
          f"{', '.join(splits)})"
      )


def check_args(
    optimizer, seed, export_dir, export_dtype, feature_lengths, **counts
):
  """What would otherwise fail at the first step, or after the last."""
  if not isinstance(optimizer, optax.GradientTransformation):
    raise ValueError(
        "train.optimizer must be an optax.GradientTransformation, e.g. "
        f"@optimizers.adamw(), got {optimizer!r}"
    )
  counts.update(
      {f"feature_lengths['{k}']": feature_lengths.get(k) for k in _FEATURES}
  )
  for name, value in counts.items():
    checks.check_count(value, f"train.{name}")
  if not checks.is_int(seed):
    raise ValueError(f"train.seed must be an int, got {seed!r}")
  if export_dtype not in _EXPORT_DTYPES:
    raise ValueError(
        f"train.export_dtype must be one of {_EXPORT_DTYPES}, got "
        f"{export_dtype!r}"
    )
  if export_dir and os.path.exists(export_dir):
    raise ValueError(
        f"train.export_dir {export_dir} exists: the export writes a new "
        "directory; remove it or name another"
    )
