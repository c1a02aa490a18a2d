"""SHA-256 checksums of a checkpoint's arrays, and the check of loaded values.

Random bytes written over an Orbax data file need not make the read fail:
tensorstore may decode them into well-formed garbage, and the model then
translates everything into ' ⁇  ⁇ ...' with no error. So an export
(`train_checkpoints.export_params`, and the shipped demo models) records,
in `checksums.json` beside `_METADATA`, each array's dtype, shape and the
SHA-256 of its bytes as stored (C order, little-endian); `load_params`
verifies them. Every loaded parameter, of any format, is also checked for
NaN and infinite values.
"""

from collections.abc import Mapping
import hashlib
import json
import os
from typing import Any

import jax.numpy as jnp
import numpy as np

from spec_decode.checkpoints import storage
from spec_decode.checkpoints import validate

FILE = "checksums.json"


def record(array: np.ndarray) -> dict[str, Any]:
  """An array's dtype, shape and SHA-256, as `FILE` holds them."""
  array = np.ascontiguousarray(array)
  little = array.dtype.newbyteorder("<")
  data = array.astype(little, copy=False).reshape(-1).view(np.uint8)
  return {
      "dtype": array.dtype.name,
      "shape": list(array.shape),
      "sha256": hashlib.sha256(data).hexdigest(),
  }


def write(directory: str, arrays: Mapping[str, np.ndarray]) -> None:
  """Writes `FILE` into `directory` for '/'-joined name -> array."""
  lines = [
      f"  {json.dumps(name)}: {json.dumps(record(np.asarray(array)))}"
      for name, array in sorted(arrays.items())
  ]  # One parameter a line.
  with open(os.path.join(directory, FILE), "w", encoding="utf-8") as f:
    f.write("{\n" + ",\n".join(lines) + "\n}\n")


def read(directory: str | None) -> dict[str, dict[str, Any]] | None:
  """The records of `FILE` in `directory`, or None if it has none."""
  if directory is None:
    return None
  path = os.path.join(directory, FILE)
  if not storage.exists(path):
    return None
  with storage.open_file(path) as f:
    return json.load(f)


def verify(
    name: str, array: np.ndarray, expected: Mapping[str, Any], source: str
) -> None:
  """Raises CheckpointError unless `array`, as stored, matches its record.

  Args:
    name: the parameter's '/'-joined name.
    array: the parameter as read, in its stored dtype.
    expected: its record in `FILE`.
    source: the checkpoint's directory, for the message.
  """
  found = record(array)
  if found != dict(expected):
    what = "checksum" if found["shape"] == expected["shape"] else "shape"
    raise validate.CheckpointError(
        f"{source}: parameter {name} does not match its {what} in {FILE} "
        f"(the checkpoint's files are corrupt or were changed after export)"
    )


def check_finite(name: str, array: np.ndarray, source: str) -> None:
  """Raises CheckpointError if a floating-point `array` holds NaN or inf."""
  if not jnp.issubdtype(array.dtype, jnp.floating):
    return
  bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
  if bad:
    raise validate.CheckpointError(
        f"{source}: parameter {name} holds {bad} NaN or infinite values of "
        f"{np.size(array)}: the checkpoint is corrupt"
    )
