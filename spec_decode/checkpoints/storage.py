"""Where checkpoint files live: local directories or `gs://` buckets.

Local files are read with Python's own file objects. Files in Google Cloud
Storage are read through a tensorstore `gcs` key-value store, the same store
that holds the arrays of a tensorstore-backed T5X checkpoint, so no other
cloud client is needed. A GCS file is read as a stream of byte ranges, so a
large msgpack checkpoint is never copied into memory whole.
"""

import io
import os
import re
from typing import Any, BinaryIO

import tensorstore as ts

from spec_decode.checkpoints import validate

_GCS_PATH = re.compile(r"gs://([^/]+)/?(.*)", re.DOTALL)
# $NAME or ${NAME}, as os.path.expandvars reads them.
_ENV_VAR = re.compile(r"\$(?:(\w+)|\{([^}]*)\})")


def is_gcs(path: str) -> bool:
  """Whether `path` names a Google Cloud Storage object (`gs://...`)."""
  return _GCS_PATH.fullmatch(os.fspath(path)) is not None


def expand(path: str) -> str:
  """`path` with `~` and environment variables ($VAR, ${VAR}) expanded.

  Raises:
    CheckpointFormatError: if it names an environment variable that is not
      set (expanding it to nothing would silently change the path).
  """
  path = os.fspath(path)
  unset = [
      m[1] or m[2]
      for m in _ENV_VAR.finditer(path)
      if (m[1] or m[2]) not in os.environ
  ]
  if unset:
    raise validate.CheckpointFormatError(
        f"{path}: environment variable {', '.join(unset)} is not set"
    )
  expanded = os.path.expandvars(path)
  return expanded if is_gcs(expanded) else os.path.expanduser(expanded)


def kvstore_spec(directory: str, relative: str = "") -> dict[str, Any]:
  """A tensorstore kvstore spec for `relative` inside `directory`.

  Args:
    directory: a local directory or `gs://bucket/dir`.
    relative: a path inside it; a trailing '/' is kept (tensorstore treats
      such a path as a directory prefix).

  Returns:
    A JSON spec: {'driver': 'file', 'path': '/abs/dir/relative'} or
    {'driver': 'gcs', 'bucket': 'bucket', 'path': 'dir/relative'}.
  """
  match = _GCS_PATH.fullmatch(os.fspath(directory))
  if match is None:
    return {
        "driver": "file",
        "path": os.path.join(os.path.abspath(directory), relative),
    }
  bucket, prefix = match.groups()
  path = relative if not prefix else os.path.join(prefix, relative)
  return {"driver": "gcs", "bucket": bucket, "path": path}


class _KvStoreReader(io.RawIOBase):
  """A read-only binary file over one key of a tensorstore kvstore."""

  def __init__(self, spec: dict[str, Any]):
    super().__init__()
    self._store = ts.KvStore.open(spec).result()
    self._position = 0

  def readable(self) -> bool:
    return True

  def readinto(self, buffer) -> int:
    end = self._position + len(buffer)
    try:
      result = self._store.read(
          "", byte_range=slice(self._position, end)
      ).result()
    except ValueError as e:
      if not str(e).startswith("OUT_OF_RANGE"):
        raise
      # The file ends before `end`: its tail is shorter than the buffer.
      result = self._store.read(
          "", byte_range=slice(self._position, None)
      ).result()
    if result.state == "missing":
      raise FileNotFoundError(f"{self._store.url} does not exist")
    data = result.value
    buffer[: len(data)] = data
    self._position += len(data)
    return len(data)


def open_kvstore_file(spec: dict[str, Any]) -> BinaryIO:
  """Opens the file named by a kvstore spec for buffered binary reading."""
  return io.BufferedReader(_KvStoreReader(spec), buffer_size=1 << 20)


def open_file(path: str) -> BinaryIO:
  """Opens a local or `gs://` file for binary reading."""
  if is_gcs(path):
    return open_kvstore_file(kvstore_spec(path))
  return open(path, "rb")


def exists(path: str) -> bool:
  """Whether a local or `gs://` file or local directory exists."""
  if not is_gcs(path):
    return os.path.exists(path)
  store = ts.KvStore.open(kvstore_spec(path)).result()
  return store.read("", byte_range=slice(0, 0)).result().state != "missing"


def read_head(path: str, size: int = 64) -> bytes:
  """The first `size` bytes of a file (fewer if it is shorter).

  Raises:
    CheckpointFormatError: if the file does not exist.
  """
  try:
    with open_file(path) as f:
      return f.read(size)
  except FileNotFoundError as e:
    raise validate.CheckpointFormatError(f"No file at {path}") from e
