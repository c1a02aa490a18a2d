"""T5X checkpoints: a msgpack `checkpoint` file, maybe with zarr directories.

The msgpack file holds the train state in one of these layouts:

* {'version': 2 | 3, 'optimizer': {'target': params, 'state': ...}} (older);
* {'version': 3, 'target': params, 'state': ..., 'flax_mutables': ...};
* {'_optimizer': {'target': ..., 'state': ...}, 'version': 3, ...} (Orbax-era
  T5X, written through Orbax's msgpack aggregate file).

Each array in it is either inline (a flax msgpack extension object), a
tensorstore spec, or an Orbax placeholder (see `tensorstore_leaf`). This
module reads one part of the state ('target', the parameters, or 'state', the
optimizer state) and skips the rest without decoding it.

Memory: inline arrays are decoded and cast one at a time while the file is
streamed (`msgpack_tree`); arrays in zarr directories are left unread until
`read` is called on them, one at a time. So the host holds at most the
requested part once, in the requested dtype, plus transient copies of the
one array being read.
"""

from collections.abc import Iterator, Mapping
import dataclasses
import os
from typing import Any

from flax import traverse_util
import jax
import msgpack
import numpy as np

from spec_decode.checkpoints import msgpack_tree
from spec_decode.checkpoints import storage
from spec_decode.checkpoints import tensorstore_leaf
from spec_decode.checkpoints import validate

# The name of the msgpack file inside a T5X checkpoint directory.
CHECKPOINT_FILE = "checkpoint"
# Keys under which T5X nests the target and state.
_WRAPPERS = ("optimizer", "_optimizer")


@dataclasses.dataclass(frozen=True)
class InlineArray:
  """An array that was stored in the msgpack file, already decoded and cast."""

  array: np.ndarray

  @property
  def shape(self) -> tuple[int, ...]:
    return self.array.shape

  def read(self, dtype=None, index=()) -> np.ndarray:
    return validate.cast(self.array[index], dtype, copy=False)


Leaf = InlineArray | tensorstore_leaf.StoredArray


def msgpack_path(path: str) -> str:
  """The msgpack file of a T5X checkpoint (a directory or the file itself)."""
  if storage.is_gcs(path) or not os.path.isdir(path):
    if storage.exists(path):
      return path
  return os.path.join(path, CHECKPOINT_FILE)


def _find_part(reader: msgpack_tree.TreeReader, part: str) -> Any:
  """Decodes `part` from the map at the reader; skips everything else."""
  found = None
  for key in reader.keys():
    if key == part:
      found = reader.value()
    elif key in _WRAPPERS:
      nested = _find_part(reader, part)
      found = found if nested is None else nested
    else:
      reader.skip()
  return found


def _flatten(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
  """Yields ('a/b/c', leaf); tensorstore specs count as leaves."""
  if isinstance(tree, Mapping) and not tensorstore_leaf.is_spec(tree):
    for key, value in tree.items():
      yield from _flatten(value, f"{prefix}{key}/")
  elif tree is not None:
    yield prefix.rstrip("/"), tree


def list_arrays(
    path: str,
    *,
    part: str = "target",
    dtype=None,
    assumed: Mapping[str, jax.ShapeDtypeStruct] | None = None,
) -> dict[str, Leaf]:
  """Lists one part of a T5X checkpoint, reading only its inline arrays.

  Args:
    path: a T5X checkpoint directory or its msgpack file, local or `gs://`.
    part: 'target' (the parameters) or 'state' (the optimizer state).
    dtype: inline floating-point arrays are cast to it as they are decoded;
      None keeps the stored dtype.
    assumed: '/'-joined name -> shape and dtype, for Orbax placeholders whose
      zarr directory has no `.zarray` metadata.

  Returns:
    '/'-joined name (relative to `part`) -> an InlineArray or a StoredArray.
    Non-array values (such as None) are left out.

  Raises:
    CheckpointFormatError: if the file is missing or is not a T5X msgpack
      checkpoint, or if it has no `part`.
  """
  file_path = msgpack_path(path)
  directory = os.path.dirname(file_path)
  assumed = assumed or {}
  try:
    with storage.open_file(file_path) as f:
      tree = _find_part(msgpack_tree.TreeReader(f, dtype), part)
  except FileNotFoundError as e:
    raise validate.CheckpointFormatError(
        f"No T5X checkpoint at {path}: {file_path} does not exist."
    ) from e
  except (ValueError, msgpack.OutOfData) as e:
    if isinstance(e, validate.CheckpointError):
      raise
    raise validate.CheckpointFormatError(
        f"{file_path} is not a T5X msgpack checkpoint ({e})."
    ) from e
  if tree is None:
    raise validate.CheckpointFormatError(
        f"T5X checkpoint {path} has no '{part}'."
    )
  leaves = {}
  for name, leaf in _flatten(tree):
    if tensorstore_leaf.is_spec(leaf):
      leaves[name] = tensorstore_leaf.StoredArray.from_spec(directory, leaf)
    elif tensorstore_leaf.is_placeholder(leaf):
      leaves[name] = tensorstore_leaf.StoredArray.from_placeholder(
          directory, leaf, assumed.get(name)
      )
    elif isinstance(leaf, np.ndarray):
      leaves[name] = InlineArray(leaf)
  return leaves


def read_tree(
    path: str,
    *,
    part: str = "target",
    dtype=None,
    assumed: Mapping[str, jax.ShapeDtypeStruct] | None = None,
) -> dict[str, Any]:
  """Reads one part of a T5X checkpoint as stored, without checking it.

  This is the raw reader: names are the checkpoint's own, and any tree (a
  model's parameters or an optimizer's state) is returned. Use
  `spec_decode.checkpoints.load_params` to load a T5 and check its shapes.

  Args:
    path: a T5X checkpoint directory or its msgpack file, local or `gs://`.
    part: 'target' (the parameters) or 'state' (the optimizer state).
    dtype: floating-point arrays are cast to it as they are read; None keeps
      each array's stored dtype.
    assumed: '/'-joined name -> shape and dtype, for Orbax placeholders whose
      zarr directory has no `.zarray` metadata.

  Returns:
    Nested dicts of numpy arrays, keyed as in the checkpoint.
  """
  leaves = list_arrays(path, part=part, dtype=dtype, assumed=assumed)
  flat = {name: leaf.read(dtype) for name, leaf in _pop_all(leaves)}
  return traverse_util.unflatten_dict(flat, sep="/")


def _pop_all(leaves: dict[str, Leaf]) -> Iterator[tuple[str, Leaf]]:
  """Yields and forgets each leaf, so its inline array can be freed."""
  while leaves:
    name = next(iter(leaves))
    yield name, leaves.pop(name)
