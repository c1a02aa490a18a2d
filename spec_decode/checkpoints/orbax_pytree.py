"""Orbax PyTree checkpoints, as T5X writes them today (`checkpoint_N/state`).

Orbax's PyTreeCheckpointHandler writes a directory with a JSON `_METADATA`
file, which lists every leaf by its key path, and one zarr array per leaf,
named by its keys joined with '.', either as a directory of its own or
(`use_ocdbt`, T5X's choice) inside one OCDBT key-value store rooted at the
checkpoint directory. T5X's Orbax CheckpointManager puts the train state
{'target': params, 'state': optimizer state, ...} in the `state`
subdirectory of each step directory.

The arrays are read straight through tensorstore, one at a time, as for the
legacy T5X format; the Orbax library itself is not needed to read.
"""

import json
import os
from typing import Any

from spec_decode.checkpoints import storage
from spec_decode.checkpoints import tensorstore_leaf
from spec_decode.checkpoints import validate

METADATA_FILE = "_METADATA"
# Where T5X's Orbax CheckpointManager puts the train state in a step directory.
STATE_DIRECTORY = "state"
# Orbax value types that are stored as zarr arrays.
_ARRAY_TYPES = ("jax.Array", "np.ndarray", "scalar")


def pytree_directory(path: str) -> str | None:
  """The Orbax PyTree directory at `path`, or None if there is none.

  Args:
    path: an Orbax PyTree directory, or a T5X step directory holding one in
      `state/`; local or `gs://`.

  Returns:
    The directory that holds `_METADATA`, or None.
  """
  for directory in (path, os.path.join(path, STATE_DIRECTORY)):
    if storage.exists(os.path.join(directory, METADATA_FILE)):
      return directory
  return None


def _read_metadata(directory: str) -> dict[str, Any]:
  with storage.open_file(os.path.join(directory, METADATA_FILE)) as f:
    metadata = json.load(f)
  if "tree_metadata" not in metadata:
    raise validate.CheckpointFormatError(
        f"{directory}/{METADATA_FILE} has no 'tree_metadata': an Orbax "
        f"metadata version spec_decode does not read."
    )
  return metadata


def list_arrays(
    path: str, *, part: str = "target"
) -> dict[str, tensorstore_leaf.StoredArray]:
  """Lists one part of an Orbax PyTree checkpoint, reading no arrays.

  Args:
    path: see `pytree_directory`.
    part: the top-level key to read ('target', the parameters, in T5X).

  Returns:
    '/'-joined key path (relative to `part`) -> StoredArray.

  Raises:
    CheckpointFormatError: if there is no Orbax PyTree at `path`, or it has
      no `part`.
  """
  directory = pytree_directory(path)
  if directory is None:
    raise validate.CheckpointFormatError(
        f"No Orbax checkpoint at {path}: no {METADATA_FILE} file."
    )
  metadata = _read_metadata(directory)
  root = storage.kvstore_spec(directory, "")
  driver = "zarr3" if metadata.get("use_zarr3") else "zarr"
  arrays = {}
  for entry in metadata["tree_metadata"].values():
    keys = [str(k["key"]) for k in entry["key_metadata"]]
    value_type = entry["value_metadata"]["value_type"]
    if keys[0] != part or value_type not in _ARRAY_TYPES:
      continue
    name = ".".join(keys)
    if metadata.get("use_ocdbt"):
      kvstore = {"driver": "ocdbt", "base": root, "path": name + "/"}
    else:
      kvstore = storage.kvstore_spec(directory, name + "/")
    arrays["/".join(keys[1:])] = tensorstore_leaf.StoredArray(
        f"{directory.rstrip('/')}/{name}", kvstore, driver=driver
    )
  if not arrays:
    raise validate.CheckpointFormatError(
        f"Orbax checkpoint {directory} has no arrays under '{part}'."
    )
  return arrays
