"""Streams a flax msgpack file (a T5X `checkpoint` file) one array at a time.

Flax writes a state tree as nested msgpack maps whose arrays are extension
objects: code 1 holds an ndarray and code 3 a numpy scalar, each as the
msgpack list [shape, dtype name, raw bytes]; code 2 holds a complex number.
An array too large for one msgpack object (over about 2 GiB) is split along
its flattened axis into a map {'__msgpack_chunked_array__': True, 'shape':
{'0': d0, ...}, 'chunks': {'0': ext, ...}}.

`TreeReader` reads such a file sequentially. The caller walks the maps it
cares about key by key and, for each value, either decodes it or skips it.
Skipping (used for optimizer state) parses past the bytes without building
any object. Decoding converts each array as soon as its bytes have been read
and casts it to the requested dtype, so the raw bytes of only one array are
alive at a time (msgpack's read buffer grows to the largest array's size).
"""

from collections.abc import Iterator
import functools
from typing import Any, BinaryIO

import jax.numpy as jnp
import msgpack
import numpy as np

from spec_decode.checkpoints import validate

# Flax's extension codes (flax.serialization._MsgpackExtType).
_NDARRAY = 1
_COMPLEX = 2
_SCALAR = 3
_CHUNKED = "__msgpack_chunked_array__"
# msgpack's own limit on one object; flax chunks arrays to stay under it.
_MAX_BUFFER_SIZE = 2**32 - 1
# Bytes read from the file at a time: large enough that a local or GCS read
# is never the bottleneck, small next to any checkpoint worth streaming.
_READ_SIZE = 16 * 2**20


def _decode_ext(code: int, data: bytes, dtype) -> Any:
  """Decodes one flax extension object, casting floating arrays to `dtype`."""
  if code in (_NDARRAY, _SCALAR):
    shape, dtype_name, buffer = msgpack.unpackb(data)
    array = np.frombuffer(buffer, dtype=jnp.dtype(dtype_name)).reshape(shape)
    return validate.cast(array, dtype)
  if code == _COMPLEX:
    real, imag = msgpack.unpackb(data)
    return complex(real, imag)
  raise validate.CheckpointFormatError(
      f"Unknown msgpack extension code {code}: not a flax checkpoint."
  )


def _join_chunks(obj: dict[str, Any]) -> Any:
  """Reassembles an array that flax split into chunks; other maps pass."""
  if _CHUNKED not in obj:
    return obj
  shape = tuple(obj["shape"][str(i)] for i in range(len(obj["shape"])))
  chunks = [obj["chunks"][str(i)] for i in range(len(obj["chunks"]))]
  return np.concatenate(chunks).reshape(shape)


class TreeReader:
  """Reads nested msgpack maps from a file, decoding only what is asked for.

  Usage, for a file holding {'version': 3, 'target': {...}, 'state': {...}}:

    reader = TreeReader(f, dtype=np.float32)
    for key in reader.keys():
      if key == 'target':
        target = reader.value()
      else:
        reader.skip()
  """

  def __init__(self, fp: BinaryIO, dtype=None):
    """Prepares to read `fp` from its current position.

    Args:
      fp: a binary file positioned at a msgpack object.
      dtype: floating-point arrays are cast to it as they are decoded; None
        keeps each array's stored dtype.
    """
    self._unpacker = msgpack.Unpacker(
        fp,
        ext_hook=functools.partial(_decode_ext, dtype=dtype),
        object_hook=_join_chunks,
        max_buffer_size=_MAX_BUFFER_SIZE,
        read_size=_READ_SIZE,
    )

  def keys(self) -> Iterator[str]:
    """Enters a map and yields its keys.

    After each key the caller must consume that key's value with `value`,
    `skip`, or (for a nested map) `keys`, before asking for the next key.

    Yields:
      The map's keys, in file order.
    """
    for _ in range(self._unpacker.read_map_header()):
      yield self._unpacker.unpack()

  def value(self) -> Any:
    """Decodes the next object: nested dicts of numpy arrays and scalars."""
    return self._unpacker.unpack()

  def skip(self) -> None:
    """Moves past the next object without building it."""
    self._unpacker.skip()
