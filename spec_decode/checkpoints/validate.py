"""Checks a checkpoint against the model's parameter tree before reading it.

Every reader in this package first lists what a checkpoint holds (names in
the t5x tree and shapes), then `check_fits` compares that listing with the
tree the model expects, and only then are arrays read. A checkpoint that does
not fit raises one `CheckpointMismatchError` that names every missing,
unexpected and mis-shaped parameter, in the spirit of nanoGPT's
`from_pretrained`, which asserts every key and shape it loads.
"""

from collections.abc import Mapping, Sequence

import jax.numpy as jnp
import numpy as np


class CheckpointError(ValueError):
  """A checkpoint that cannot be loaded; the message says why."""


class CheckpointFormatError(CheckpointError):
  """The path holds no checkpoint, or one in a format this package refuses."""


class CheckpointMismatchError(CheckpointError):
  """The checkpoint's parameters are not the ones the model expects."""

  # report.one_line shows every line: the list of mismatches.
  multiline = True


# The parameter whose leading axis is the vocabulary in every T5.
EMBEDDING = "token_embedder/embedding"


def _shape(shape):
  return "[" + ", ".join(str(d) for d in shape) + "]"


def check_fits(
    found: Mapping[str, Sequence[int]],
    expected: Mapping[str, Sequence[int]],
    source: str,
    notes: Sequence[str] = (),
) -> None:
  """Raises if the checkpoint's parameters differ from the expected ones.

  Args:
    found: '/'-joined t5x parameter name -> shape, as stored in the checkpoint.
    expected: '/'-joined t5x parameter name -> shape the model needs.
    source: the checkpoint's path, for the message.
    notes: extra lines for the message (e.g. why a name was unexpected); they
      are only shown when something does not fit.

  Raises:
    CheckpointMismatchError: listing every missing parameter (with the shape
      the model expects), every unexpected one (with its stored shape), every
      mis-shaped one (both shapes), and the vocabulary sizes when they differ.
  """
  missing = sorted(set(expected) - set(found))
  unexpected = sorted(set(found) - set(expected))
  misshaped = sorted(
      name
      for name in set(found) & set(expected)
      if tuple(found[name]) != tuple(expected[name])
  )
  if not (missing or unexpected or misshaped):
    return
  lines = [f"Checkpoint {source} does not fit the model:"]
  if EMBEDDING in misshaped:
    lines.append(
        f"  vocabulary size mismatch: the checkpoint has "
        f"{found[EMBEDDING][0]} tokens, the model expects "
        f"{expected[EMBEDDING][0]} (set T5Config.vocab_size)"
    )
  lines += [f"  missing: {n} {_shape(expected[n])}" for n in missing]
  lines += [f"  unexpected: {n} {_shape(found[n])}" for n in unexpected]
  lines += [
      f"  wrong shape: {n} is {_shape(found[n])} in the checkpoint, the model "
      f"expects {_shape(expected[n])}"
      for n in misshaped
  ]
  lines += [f"  note: {note}" for note in notes]
  raise CheckpointMismatchError("\n".join(lines))


def cast(array: np.ndarray, dtype, copy: bool = True) -> np.ndarray:
  """Casts an array read from a checkpoint if it is floating point.

  With `copy`, the result owns its memory, so the buffer the array was decoded
  from (a msgpack object, a memory-mapped file) can be freed at once.

  Args:
    array: any numpy array or view, [*shape], in its stored dtype.
    dtype: the dtype for floating-point arrays; None keeps the stored one.
      Other arrays (integer step counters) always keep theirs.
    copy: whether to copy even when no cast is needed.

  Returns:
    A C-ordered array, [*shape], of `dtype` if `array` is floating point.
  """
  if dtype is None or not jnp.issubdtype(array.dtype, jnp.floating):
    dtype = array.dtype
  return array.astype(dtype, order="C", copy=copy)
