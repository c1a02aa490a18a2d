"""Arrays stored as zarr arrays beside a checkpoint's metadata, read lazily.

`StoredArray` names one such array and reads it through tensorstore when
asked. Orbax PyTree checkpoints (`orbax_pytree.py`) hold only such arrays.
In a T5X msgpack file, two kinds of leaf point at one:

* a tensorstore spec (legacy T5X): {'driver': 'zarr', 'dtype': 'float32',
  'kvstore': {'driver': 'gfile' | 'file' | 'gcs', 'path': 'target.x.y/'},
  'metadata': {'shape': [...], 'chunks': [...], 'compressor': {...}}}, whose
  path is relative to the checkpoint directory (T5X writes GCS specs with a
  dummy bucket and fills in the real one when reading);
* the string 'PLACEHOLDER://target.x.y' (Orbax-era T5X): the array is the zarr
  directory 'target.x.y' of the checkpoint directory.

The spec's own kvstore is ignored: the array is looked up relative to where
the checkpoint is now (a local directory or `gs://bucket/dir`), so a copied
checkpoint still loads. The zarr metadata stored with the array (`.zarray`)
is used when present; otherwise the metadata in the spec is assumed, and a
placeholder without stored metadata needs its shape and dtype from the
caller (the t5x test fixtures ship without their `.zarray` files).
"""

import dataclasses
from typing import Any

import jax
import numpy as np
import tensorstore as ts

from spec_decode.checkpoints import storage
from spec_decode.checkpoints import validate

PLACEHOLDER = "PLACEHOLDER://"
# Orbax's default zarr compressor, assumed for a placeholder without metadata.
_ORBAX_COMPRESSOR = {"id": "zstd", "level": 1}


def is_spec(leaf: Any) -> bool:
  """Whether a decoded msgpack value is a tensorstore spec."""
  return isinstance(leaf, dict) and {"driver", "kvstore"} <= set(leaf)


def is_placeholder(leaf: Any) -> bool:
  """Whether a decoded msgpack value is an Orbax placeholder string."""
  return isinstance(leaf, str) and leaf.startswith(PLACEHOLDER)


def _brief(error: Exception) -> str:
  """A tensorstore error message without the spec it appends."""
  return str(error).split(" [tensorstore_spec=")[0]


@dataclasses.dataclass(frozen=True)
class StoredArray:
  """One array in a zarr directory of a checkpoint; nothing read yet.

  Attributes:
    location: where the array is, for messages.
    kvstore: the tensorstore kvstore spec of its zarr directory.
    driver: the tensorstore driver, 'zarr' (zarr v2) or 'zarr3'.
    dtype: the stored dtype name, if known without opening the array.
    metadata: zarr v2 metadata (shape, chunks, compressor) to assume when the
      directory has no `.zarray` file; None to require the stored one.
  """

  location: str
  kvstore: dict[str, Any]
  driver: str = "zarr"
  dtype: str | None = None
  metadata: dict[str, Any] | None = None

  @classmethod
  def in_directory(
      cls, directory: str, relative: str, **kwargs: Any
  ) -> "StoredArray":
    """The array in zarr directory `relative` of checkpoint `directory`."""
    relative = relative.strip("/")
    return cls(
        f"{directory.rstrip('/')}/{relative}",
        storage.kvstore_spec(directory, relative + "/"),
        **kwargs,
    )

  @classmethod
  def from_spec(cls, directory: str, spec: dict[str, Any]) -> "StoredArray":
    """The array named by a legacy T5X tensorstore spec."""
    # tensorstore < 0.1.14 kept the path at the top level of the spec.
    relative = spec["kvstore"].get("path", spec.get("path"))
    if relative is None:
      raise validate.CheckpointFormatError(
          f"A tensorstore spec in {directory} has no path: {spec}"
      )
    return cls.in_directory(
        directory,
        relative,
        dtype=spec.get("dtype"),
        metadata=spec.get("metadata"),
    )

  @classmethod
  def from_placeholder(
      cls,
      directory: str,
      placeholder: str,
      assumed: jax.ShapeDtypeStruct | None = None,
  ) -> "StoredArray":
    """The array named by an Orbax placeholder.

    Args:
      directory: the checkpoint directory.
      placeholder: 'PLACEHOLDER://<zarr directory name>'.
      assumed: the array's shape and dtype, used only if its directory holds
        no `.zarray`; it is then assumed to be one zstd chunk (Orbax's
        default for small arrays).

    Returns:
      The StoredArray.
    """
    relative = placeholder[len(PLACEHOLDER) :]
    if assumed is None:
      return cls.in_directory(directory, relative)
    shape = list(assumed.shape)
    return cls.in_directory(
        directory,
        relative,
        dtype=np.dtype(assumed.dtype).name,
        metadata={
            "shape": shape,
            "chunks": shape,
            "compressor": _ORBAX_COMPRESSOR,
        },
    )

  def open(self) -> ts.TensorStore:
    """Opens the array for reading (reads its metadata, not its data).

    Raises:
      CheckpointFormatError: if the array cannot be opened, e.g. because it
        has no stored metadata and none to assume.
    """
    spec = {"driver": self.driver, "kvstore": self.kvstore}
    assume = False
    if self.metadata is not None and self.dtype is not None:
      store = ts.KvStore.open(self.kvstore).result()
      if store.read(".zarray").result().state == "missing":
        spec.update(dtype=self.dtype, metadata=self.metadata)
        assume = True
    try:
      return ts.open(
          spec, read=True, open=True, assume_metadata=assume
      ).result()
    except ValueError as e:
      raise validate.CheckpointFormatError(
          f"Cannot open array {self.location}: {_brief(e)}"
      ) from e

  @property
  def shape(self) -> tuple[int, ...]:
    """The array's shape, from the spec if it has one, else from storage."""
    if self.metadata is not None:
      return tuple(self.metadata["shape"])
    return tuple(self.open().shape)

  def read(self, dtype=None, index=()) -> np.ndarray:
    """Reads the array, or only the chunks that `index` touches.

    Args:
      dtype: floating-point arrays are cast to it; None keeps the stored one.
      index: a tuple of slices, one per leading axis (a device's shard); ()
        reads everything.

    Returns:
      array[index], of `dtype` (floating) or its stored dtype.
    """
    array = self.open()
    try:
      return validate.cast(array[index].read().result(), dtype, copy=False)
    except ValueError as e:
      raise validate.CheckpointFormatError(
          f"Cannot read array {self.location}: {_brief(e)}"
      ) from e
