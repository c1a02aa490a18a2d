"""Loads T5 checkpoints into the t5x parameter tree of `models/t5.py`.

Formats:

* T5X (`t5x.py`): a directory with a msgpack `checkpoint` file (or that file
  itself), its arrays inline, in tensorstore zarr directories (legacy T5X,
  local or `gs://`), or behind Orbax placeholders (Orbax-era T5X);
* Orbax PyTree (`orbax_pytree.py`): a directory with `_METADATA` (or a T5X
  step directory with one in `state/`), as T5X writes with Orbax today;
* Hugging Face (`hf.py`): `model.safetensors`, sharded
  `model.safetensors.index.json`, `pytorch_model.bin` (needs torch),
  `flax_model.msgpack`; `config.json` beside them gives the model's
  T5Config (`hf_config.py`);
* Mesh TensorFlow (the original T5 release): detected and refused, with the
  command that converts it to T5X.

Usage:

  expected = t5.param_shapes(config)
  params = checkpoints.load_params(path, expected, dtype=jnp.bfloat16)
  logits = t5.Transformer(config).apply({'params': params}, inputs, targets)

Every format is listed first (names and shapes, no weights; inline T5X arrays
excepted, see below) and checked against `expected`, so a checkpoint that does
not fit fails with one `CheckpointMismatchError` naming every difference
before any large read. Optimizer state is never decoded.

Memory bound: the host never holds more than one full copy of the
parameters, in the requested dtype, plus a few transient copies of the one
parameter being read. Weights in separate files (zarr arrays, safetensors,
memory-mapped torch files) are read, cast and transposed one tensor at a
time; inline T5X arrays are cast as the msgpack file is streamed
(`msgpack_tree.py`), each freed in its stored dtype as soon as its cast copy
exists.
"""

from collections.abc import Mapping
import enum
import os
import socket
from typing import Any

from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.checkpoints import checksums
from spec_decode.checkpoints import hf
from spec_decode.checkpoints import orbax_pytree
from spec_decode.checkpoints import storage
from spec_decode.checkpoints import t5x
from spec_decode.checkpoints import validate
from spec_decode.checkpoints.validate import CheckpointError
from spec_decode.checkpoints.validate import CheckpointFormatError
from spec_decode.checkpoints.validate import CheckpointMismatchError

__all__ = [
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointMismatchError",
    "Format",
    "detect_format",
    "load_params",
    "stored_dtype",
]

# The first bytes of TensorFlow's `checkpoint` text file (Mesh TensorFlow).
_TF_CHECKPOINT_HEADER = b"model_checkpoint_path"
# The first byte of a msgpack map (fixmap, map 16, map 32).
_MSGPACK_MAP = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}
# The parameter T5 1.1 has and T5 1.0 (logits via the embedding) lacks.
_LOGITS = "decoder/logits_dense/kernel"


class Format(enum.Enum):
  """The checkpoint formats `detect_format` tells apart."""

  T5X = "T5X"
  ORBAX = "Orbax"
  HUGGING_FACE = "Hugging Face"
  MESH_TENSORFLOW = "Mesh TensorFlow"


def _mesh_tensorflow_error(path: str) -> CheckpointFormatError:
  return CheckpointFormatError(
      f"{path} is a Mesh TensorFlow checkpoint (the original T5 release), "
      f"which spec_decode does not read; convert it to T5X with t5x's "
      f"converter: python -m t5x.scripts.convert_tf_checkpoint "
      f"--gin_file=<the model's .gin> --gin.convert_checkpoint.model=%MODEL "
      f"--gin.convert_checkpoint.tf_checkpoint_path=<dir>/model.ckpt-<step> "
      f"--gin.convert_checkpoint.output_dir=<new dir>, then load <new dir>."
  )


def _file_format(path: str) -> Format | None:
  """The format of a single file, from its name or first bytes."""
  if path.endswith(".index") or storage.exists(path + ".index"):
    return Format.MESH_TENSORFLOW
  if not storage.exists(path):
    return None
  if not storage.is_gcs(path) and hf.find_files(path):
    return Format.HUGGING_FACE
  head = storage.read_head(path)
  if head.startswith(_TF_CHECKPOINT_HEADER):
    return Format.MESH_TENSORFLOW
  if head and head[0] in _MSGPACK_MAP:
    return Format.T5X
  return None


def detect_format(path: str) -> Format:
  """Tells which format the checkpoint at `path` is in.

  Args:
    path: a checkpoint directory or file, local or (T5X only) `gs://`; `~`
      and environment variables are expanded.

  Returns:
    The format.

  Raises:
    CheckpointFormatError: if nothing is at `path`, or nothing known.
  """
  path = storage.expand(path)
  if storage.is_gcs(path) or not os.path.isdir(path):
    found = _file_format(path)
    if found is not None:
      return found
  if os.path.isdir(path) and hf.find_files(path):
    return Format.HUGGING_FACE
  if orbax_pytree.pytree_directory(path) is not None:
    return Format.ORBAX
  inner = _file_format(os.path.join(path, t5x.CHECKPOINT_FILE))
  if inner is not None:
    return inner
  if os.path.isdir(path):
    if any(name.endswith(".index") for name in os.listdir(path)):
      return Format.MESH_TENSORFLOW
    raise CheckpointFormatError(
        f"No checkpoint found in directory {path}: expected a T5X "
        f"'{t5x.CHECKPOINT_FILE}' msgpack file, an Orbax "
        f"'{orbax_pytree.METADATA_FILE}' file, or Hugging Face weights "
        f"({', '.join(hf.FILE_NAMES)})."
    )
  if storage.is_gcs(path) or os.path.exists(path):
    raise CheckpointFormatError(
        f"Unknown checkpoint format at {path}: neither a T5X msgpack file nor "
        f"Hugging Face weights."
    )
  raise CheckpointFormatError(f"No checkpoint at {path}: it does not exist.")


def load_params(
    path: str,
    expected: Mapping[str, Any],
    dtype: Any = jnp.float32,
    shardings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
  """Loads a T5 checkpoint into the t5x parameter tree.

  Args:
    path: a T5X checkpoint directory (or its `checkpoint` file) or an Orbax
      checkpoint directory, local or `gs://`; or a Hugging Face checkpoint
      directory or weight file.
    expected: the parameter tree the model needs, nested dicts whose leaves
      have `.shape` (e.g. `t5.param_shapes(config)`, of jax.ShapeDtypeStruct;
      no 'params' wrapper).
    dtype: the dtype of every floating-point parameter (jnp.float32 or
      jnp.bfloat16); None gives each parameter its `expected` leaf's dtype.
    shardings: the same tree of jax.sharding.Sharding, to place each
      parameter on devices as it is read. Each host then reads only the
      slices its own devices hold (from zarr arrays and safetensors files;
      a msgpack file with inline arrays is decoded whole), each slice once.

  Returns:
    Nested dicts with exactly the names of `expected`, of numpy arrays of the
    same shapes (jax.Arrays, sharded, with `shardings`), in `dtype`. Pass
    them as `{'params': tree}`.

  Raises:
    CheckpointFormatError: if nothing is at `path`, its format is unknown, or
      it is a Mesh TensorFlow checkpoint.
    CheckpointMismatchError: if the checkpoint's parameters differ from
      `expected`; the message lists every missing, unexpected and mis-shaped
      parameter and names a vocabulary-size mismatch.
    CheckpointError: if a parameter differs from its checksum (Orbax
      checkpoints with a `checksums.json`, as exports write) or holds NaN or
      infinite values, naming it.
  """
  path = storage.expand(path)
  wanted = traverse_util.flatten_dict(expected, sep="/")
  if storage.is_gcs(path):
    _check_gcs_reachable(path)
  found_format = detect_format(path)
  if found_format is Format.MESH_TENSORFLOW:
    raise _mesh_tensorflow_error(path)
  notes = []
  sums = None
  if found_format is Format.T5X:
    leaves = t5x.list_arrays(path, dtype=dtype)
  elif found_format is Format.ORBAX:
    leaves = orbax_pytree.list_arrays(path)
    sums = checksums.read(orbax_pytree.pytree_directory(path))
  else:
    leaves, notes = hf.list_params(
        path, logits_via_embedding=_LOGITS not in wanted, dtype=dtype
    )
  validate.check_fits(
      {name: leaf.shape for name, leaf in leaves.items()},
      {name: leaf.shape for name, leaf in wanted.items()},
      path,
      notes,
  )
  if shardings is not None:
    shardings = traverse_util.flatten_dict(shardings, sep="/")
  params = {}
  for name in wanted:
    leaf_dtype = dtype if dtype is not None else wanted[name].dtype
    params[name] = _read_checked(
        name,
        leaves.pop(name),
        leaf_dtype,
        None if shardings is None else shardings[name],
        sums,
        path,
    )
  return traverse_util.unflatten_dict(params, sep="/")


def stored_dtype(path: str) -> str:
  """The dtype `T5Config.dtype = 'auto'` takes for the checkpoint at `path`.

  Returns:
    'bfloat16' if the checkpoint stores its weights in bfloat16, else
    'float32'.

  Raises:
    CheckpointFormatError: the checkpoint is not a Hugging Face one (the
      others do not say their dtype without being read whole).
  """
  path = storage.expand(path)
  if detect_format(path) is not Format.HUGGING_FACE:
    raise CheckpointFormatError(
        f"T5Config.dtype = 'auto' reads the stored dtype of Hugging Face "
        f"checkpoints only; {path} is not one: set 'float32' or 'bfloat16'"
    )
  return hf.stored_dtype(path)


# The host every gs:// read goes to.
_GCS_HOST = "storage.googleapis.com"


def _check_gcs_reachable(path):
  """Fails at once when GCS is unreachable (offline, tensorstore retries for
  minutes)."""
  try:
    socket.getaddrinfo(_GCS_HOST, 443)
  except OSError as e:
    raise CheckpointError(
        f"cannot read {path}: {_GCS_HOST} does not resolve ({e.strerror}); "
        "with no network, copy the checkpoint to a local directory and bind "
        "its path"
    ) from None


def _read_checked(name, leaf, dtype, sharding, sums, source):
  """Reads one parameter, checked: finite, and its checksum if recorded.

  Args:
    name: the '/'-joined parameter name.
    leaf: its stored array (any format's leaf, with `shape` and `read`).
    dtype: the dtype to load it in.
    sharding: where to place it, shard by shard; None for a numpy array.
    sums: the checkpoint's `checksums.FILE` records, or None.
    source: the checkpoint's path, for messages.

  Returns:
    The parameter (numpy, or a sharded jax.Array).

  Raises:
    CheckpointError: naming the parameter, on a NaN or infinite value or a
      checksum that differs.
  """

  def read(index=()):
    value = leaf.read(dtype, index)
    checksums.check_finite(name, value, source)
    return value

  value = read() if sharding is None else _place(leaf.shape, read, sharding)
  if sums is not None:
    if name not in sums:
      raise CheckpointError(
          f"{source}: parameter {name} has no record in {checksums.FILE}"
      )
    _verify(name, leaf, value, sums[name], source)
  return value


def _verify(name, leaf, value, record, source):
  """Checks a loaded parameter against its checksum record.

  The loaded value, cast back to the stored dtype, is hashed when that cast
  is exact (the load kept or widened the dtype: bfloat16 exports loaded in
  float32), so nothing is read twice; else the stored array is read whole.
  On several hosts, where no host holds the whole parameter, only the
  value checks apply.
  """
  if isinstance(value, jax.Array) and not value.is_fully_addressable:
    return
  stored = jnp.dtype(record["dtype"])
  host = np.asarray(value)
  if jnp.promote_types(stored, host.dtype) == host.dtype:
    as_stored = host.astype(stored)
  else:
    as_stored = leaf.read(None)
  checksums.verify(name, as_stored, record, source)


def _place(shape, read, sharding):
  """Reads one parameter shard by shard onto its devices (each slice once)."""
  slices = {}

  def shard(index):
    key = tuple((s.start, s.stop, s.step) for s in index)
    if key not in slices:
      slices[key] = read(index)
    return slices[key]

  return jax.make_array_from_callback(shape, sharding, shard)
