"""The tensors of one Hugging Face weight file, by HF name, not read yet.

Three kinds of file:

* `.safetensors`: listed from the header; a tensor (or a device's slice of
  it) is read through `safe_open` when asked for;
* `.bin` (`pytorch_model.bin`): a torch state dict, opened with
  `weights_only=True` and memory-mapped (needs torch);
* `flax_model.msgpack`: a FlaxT5ForConditionalGeneration's parameters, a
  flax msgpack tree with no header, decoded whole (each array cast as it is
  read). Its names are rewritten to torch's: a Dense layer's `kernel`
  [in, out] is the torch `weight` [out, in] transposed (`HfTensor.kernel`),
  an embedding's `embedding` is the torch `weight` as it is.
"""

import dataclasses
import pickle
from typing import Any

import jax.numpy as jnp
import msgpack
import numpy as np
import safetensors

from spec_decode.checkpoints import msgpack_tree
from spec_decode.checkpoints import validate

# safetensors' dtype names -> numpy's.
_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "BF16": "bfloat16",
    "F16": "float16",
}
# Flax leaf names -> torch's, and whether the Flax array is the transpose.
_FLAX_LEAVES = {"kernel": ("weight", True), "embedding": ("weight", False)}


def _torch_to_numpy(tensor: Any) -> np.ndarray:
  """A numpy view of a CPU torch tensor (bfloat16 through its bits)."""
  import torch  # pylint: disable=g-import-not-at-top

  if tensor.dtype == torch.bfloat16:
    return tensor.view(torch.int16).numpy().view(jnp.bfloat16)
  return tensor.numpy()


@dataclasses.dataclass(frozen=True)
class HfTensor:
  """One tensor of an HF checkpoint file, not read yet.

  Attributes:
    file: the file holding it.
    name: its HF (torch) name.
    transpose: whether the t5x parameter is its transpose as stored.
    stored_shape: its shape in the file.
    dtype: its stored dtype's name ('float32', 'bfloat16', ...).
    tensor: for a torch file, the memory-mapped torch tensor; for a Flax
      file, the decoded numpy array; None for safetensors.
    kernel: whether it is stored as the transpose of torch's weight (a Flax
      Dense kernel).
  """

  file: str
  name: str
  transpose: bool
  stored_shape: tuple[int, ...]
  dtype: str
  tensor: Any = None
  kernel: bool = False

  @property
  def shape(self) -> tuple[int, ...]:
    """The t5x parameter's shape."""
    return self.stored_shape[::-1] if self.transpose else self.stored_shape

  def read_stored(self, index=()) -> np.ndarray:
    """The tensor as stored, [*stored_shape][index], in its stored dtype."""
    if isinstance(self.tensor, np.ndarray):
      return self.tensor[index]
    if self.tensor is not None:
      return _torch_to_numpy(self.tensor[index] if index else self.tensor)
    with safetensors.safe_open(self.file, framework="numpy") as f:
      if not index:
        return f.get_tensor(self.name)
      return f.get_slice(self.name)[index]

  def read(self, dtype=None, index=()) -> np.ndarray:
    """The t5x parameter, [*shape][index], cast to `dtype` if given.

    Args:
      dtype: floating-point tensors are cast to it; None keeps the stored one.
      index: a tuple of slices into the t5x parameter (a device's shard); only
        that part is read from a safetensors file.
    """
    if not self.transpose:
      return validate.cast(self.read_stored(tuple(index)), dtype)
    index = tuple(index) + (slice(None),) * (len(self.shape) - len(index))
    return validate.cast(self.read_stored(index[::-1]).T, dtype)


def _list_safetensors(file: str) -> dict[str, HfTensor]:
  try:
    with safetensors.safe_open(file, framework="numpy") as f:
      tensors = {}
      for name in f.keys():
        info = f.get_slice(name)
        dtype = _SAFETENSORS_DTYPES.get(info.get_dtype(), info.get_dtype())
        tensors[name] = HfTensor(
            file, name, False, tuple(info.get_shape()), dtype
        )
      return tensors
  except (safetensors.SafetensorError, OSError) as e:
    raise validate.CheckpointFormatError(f"Cannot read {file}: {e}") from e


def _list_torch(file: str) -> dict[str, HfTensor]:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise validate.CheckpointFormatError(
        f"{file} is a PyTorch checkpoint and torch is not installed; install "
        f"torch or convert it to safetensors."
    ) from e
  try:
    state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
  except (RuntimeError, OSError, pickle.UnpicklingError) as e:
    raise validate.CheckpointFormatError(
        f"Cannot read {file} with torch.load(weights_only=True, mmap=True): "
        f"{e}"
    ) from e
  return {
      name: HfTensor(
          file, name, False, tuple(t.shape), str(t.dtype).split(".")[-1], t
      )
      for name, t in state.items()
  }


def _flatten(tree: Any, prefix: str = ""):
  """Yields ('a.b.c', array) for the arrays of nested dicts."""
  if isinstance(tree, dict):
    for key, value in tree.items():
      yield from _flatten(value, f"{prefix}{key}.")
  elif isinstance(tree, np.ndarray):
    yield prefix[:-1], tree


def _list_flax(file: str, dtype) -> dict[str, HfTensor]:
  try:
    with open(file, "rb") as f:
      tree = msgpack_tree.TreeReader(f, dtype).value()
  except (ValueError, OSError, msgpack.OutOfData) as e:
    if isinstance(e, validate.CheckpointError):
      raise
    raise validate.CheckpointFormatError(
        f"{file} is not a Hugging Face Flax msgpack checkpoint ({e})."
    ) from e
  if not isinstance(tree, dict) or "shared" not in tree:
    raise validate.CheckpointFormatError(
        f"{file} is not a Hugging Face Flax T5 checkpoint: it has no 'shared' "
        f"embedding."
    )
  tensors = {}
  for flax_name, array in _flatten(tree):
    stem, _, leaf = flax_name.rpartition(".")
    torch_leaf, kernel = _FLAX_LEAVES.get(leaf, (leaf, False))
    name = f"{stem}.{torch_leaf}"
    tensors[name] = HfTensor(
        file, name, False, array.shape, str(array.dtype), array, kernel
    )
  return tensors


def list_file(file: str, dtype=None) -> dict[str, HfTensor]:
  """Every tensor of one weight file, by torch name.

  Args:
    file: a `.safetensors`, `.bin` or `flax_model.msgpack` file.
    dtype: what a Flax file's floating arrays are cast to as they are decoded
      (None keeps them as stored); the other files are read later.

  Returns:
    torch name -> HfTensor (transpose False: the caller decides).

  Raises:
    CheckpointFormatError: the file cannot be read as what its name says.
  """
  if file.endswith(".safetensors"):
    return _list_safetensors(file)
  if file.endswith(".msgpack"):
    return _list_flax(file, dtype)
  return _list_torch(file)
