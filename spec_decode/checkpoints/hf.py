"""Hugging Face T5 checkpoints (`T5ForConditionalGeneration`) as t5x params.

Reads `model.safetensors`, sharded `model.safetensors.index.json`,
`pytorch_model.bin` and sharded `pytorch_model.bin.index.json` (the last two
only when torch is installed; they are opened with `weights_only=True` and
memory-mapped).

Names map as follows; S is encoder or decoder, i a layer, (T) a transpose:

  shared.weight                    -> token_embedder/embedding
  S.block.0.layer.0.SelfAttention.relative_attention_bias.weight
                                   -> S/relpos_bias/rel_embedding (T)
  S.final_layer_norm.weight        -> S/S_norm/scale
  lm_head.weight                   -> decoder/logits_dense/kernel (T)
  encoder.block.i.layer.0          -> encoder/layers_i/
      SelfAttention.{q,k,v,o}.weight  attention/{query,key,value,out}/kernel (T)
      layer_norm.weight               pre_attention_layer_norm/scale
  encoder.block.i.layer.1          -> encoder/layers_i/
      DenseReluDense.{wi,wi_0,wi_1,wo}.weight  mlp/{...}/kernel (T)
      layer_norm.weight                        pre_mlp_layer_norm/scale
  decoder.block.i.layer.0          -> decoder/layers_i/
      SelfAttention.*, layer_norm     self_attention/*,
                                      pre_self_attention_layer_norm
  decoder.block.i.layer.1          -> decoder/layers_i/
      EncDecAttention.*, layer_norm   encoder_decoder_attention/*,
                                      pre_cross_attention_layer_norm
  decoder.block.i.layer.2          -> decoder/layers_i/
      DenseReluDense.*, layer_norm    mlp/*, pre_mlp_layer_norm

(T) marks a transpose: torch's Linear stores [out, in], a t5x kernel is
[in, out]; HF's bias table is [buckets, heads], t5x's [heads, buckets].
`encoder.embed_tokens.weight` and `decoder.embed_tokens.weight` are copies of
`shared.weight` and are skipped. A T5 1.0 model ties `lm_head.weight` to
`shared.weight`: when the model computes logits through the embedding, an
`lm_head.weight` equal to `shared.weight` is dropped.

Memory: tensors are listed from the files' headers, then read one at a time
(safetensors through `safe_open`, torch files memory-mapped), cast and
transposed, so only one tensor is in flight beside the loaded parameters.
"""

import dataclasses
import json
import os
import pickle
import re
from typing import Any

import jax.numpy as jnp
import numpy as np
import safetensors

from spec_decode.checkpoints import validate

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"
# In order of preference when a directory holds several.
FILE_NAMES = (SAFETENSORS_INDEX, SAFETENSORS, TORCH_INDEX, TORCH)

_LM_HEAD = "lm_head.weight"
_SHARED = "shared.weight"
_LOGITS = "decoder/logits_dense/kernel"
_ATTENTION = {"q": "query", "k": "key", "v": "value", "o": "out"}
# (HF name pattern, t5x name template, transpose). Patterns are full matches.
_RULES = (
    (r"shared\.weight", "token_embedder/embedding", False),
    (
        r"(encoder|decoder)\.block\.0\.layer\.0\.SelfAttention"
        r"\.relative_attention_bias\.weight",
        "{0}/relpos_bias/rel_embedding",
        True,
    ),
    (
        r"encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.([qkvo])\.weight",
        "encoder/layers_{0}/attention/{1}/kernel",
        True,
    ),
    (
        r"encoder\.block\.(\d+)\.layer\.0\.layer_norm\.weight",
        "encoder/layers_{0}/pre_attention_layer_norm/scale",
        False,
    ),
    (
        r"encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.(wi|wi_0|wi_1|wo)"
        r"\.weight",
        "encoder/layers_{0}/mlp/{1}/kernel",
        True,
    ),
    (
        r"encoder\.block\.(\d+)\.layer\.1\.layer_norm\.weight",
        "encoder/layers_{0}/pre_mlp_layer_norm/scale",
        False,
    ),
    (
        r"decoder\.block\.(\d+)\.layer\.0\.SelfAttention\.([qkvo])\.weight",
        "decoder/layers_{0}/self_attention/{1}/kernel",
        True,
    ),
    (
        r"decoder\.block\.(\d+)\.layer\.0\.layer_norm\.weight",
        "decoder/layers_{0}/pre_self_attention_layer_norm/scale",
        False,
    ),
    (
        r"decoder\.block\.(\d+)\.layer\.1\.EncDecAttention\.([qkvo])\.weight",
        "decoder/layers_{0}/encoder_decoder_attention/{1}/kernel",
        True,
    ),
    (
        r"decoder\.block\.(\d+)\.layer\.1\.layer_norm\.weight",
        "decoder/layers_{0}/pre_cross_attention_layer_norm/scale",
        False,
    ),
    (
        r"decoder\.block\.(\d+)\.layer\.2\.DenseReluDense\.(wi|wi_0|wi_1|wo)"
        r"\.weight",
        "decoder/layers_{0}/mlp/{1}/kernel",
        True,
    ),
    (
        r"decoder\.block\.(\d+)\.layer\.2\.layer_norm\.weight",
        "decoder/layers_{0}/pre_mlp_layer_norm/scale",
        False,
    ),
    (
        r"(encoder|decoder)\.final_layer_norm\.weight",
        "{0}/{0}_norm/scale",
        False,
    ),
    (r"lm_head\.weight", _LOGITS, True),
)
# Copies of shared.weight, and a bias table HF itself ignores on loading.
_SKIPPED = (
    r"(encoder|decoder)\.embed_tokens\.weight",
    r"decoder\.block\.0\.layer\.1\.EncDecAttention"
    r"\.relative_attention_bias\.weight",
)


def t5x_name(hf_name: str) -> tuple[str, bool] | None:
  """The t5x parameter an HF tensor holds, and whether it is transposed.

  Args:
    hf_name: a key of an HF T5 state dict, e.g.
      'decoder.block.1.layer.1.EncDecAttention.q.weight'.

  Returns:
    ('decoder/layers_1/encoder_decoder_attention/query/kernel', True), or
    None if the tensor is a duplicate to skip. A name no rule knows maps to
    itself (untransposed), so that it is reported as unexpected.
  """
  for pattern in _SKIPPED:
    if re.fullmatch(pattern, hf_name):
      return None
  for pattern, template, transpose in _RULES:
    match = re.fullmatch(pattern, hf_name)
    if match:
      groups = [_ATTENTION.get(g, g) for g in match.groups()]
      return template.format(*groups), transpose
  return hf_name, False


def find_files(path: str) -> list[str]:
  """The weight files of an HF checkpoint (a directory or one file).

  Args:
    path: a local directory holding one of FILE_NAMES, or one such file (a
      shard index, a `.safetensors` file or a `.bin` file).

  Returns:
    The files to read (the shards an index lists, or the one file); empty if
    `path` is not an HF checkpoint.
  """
  if os.path.isdir(path):
    for name in FILE_NAMES:
      if os.path.isfile(os.path.join(path, name)):
        return find_files(os.path.join(path, name))
    return []
  if path.endswith(".index.json"):
    try:
      with open(path) as f:
        weight_map = json.load(f)["weight_map"]
    except (OSError, ValueError, KeyError) as e:
      raise validate.CheckpointFormatError(
          f"{path} is not a Hugging Face shard index: {e!r}"
      ) from e
    directory = os.path.dirname(path)
    return [
        os.path.join(directory, name)
        for name in sorted(set(weight_map.values()))
    ]
  if path.endswith((".safetensors", ".bin")):
    return [path]
  return []


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
    file: the `.safetensors` or `.bin` file holding it.
    name: its HF name.
    transpose: whether the t5x parameter is its transpose.
    stored_shape: its shape in the file.
    tensor: for a torch file, the memory-mapped torch tensor.
  """

  file: str
  name: str
  transpose: bool
  stored_shape: tuple[int, ...]
  tensor: Any = None

  @property
  def shape(self) -> tuple[int, ...]:
    """The t5x parameter's shape."""
    return self.stored_shape[::-1] if self.transpose else self.stored_shape

  def read_stored(self, index=()) -> np.ndarray:
    """The tensor as stored, [*stored_shape][index], in its stored dtype."""
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


def _list_file(file: str) -> dict[str, HfTensor]:
  """Every tensor of one file, by HF name, reading headers only."""
  if file.endswith(".safetensors"):
    try:
      with safetensors.safe_open(file, framework="numpy") as f:
        return {
            name: HfTensor(
                file, name, False, tuple(f.get_slice(name).get_shape())
            )
            for name in f.keys()
        }
    except (safetensors.SafetensorError, OSError) as e:
      raise validate.CheckpointFormatError(f"Cannot read {file}: {e}") from e
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
      name: HfTensor(file, name, False, tuple(t.shape), t)
      for name, t in state.items()
  }


def list_params(
    path: str, logits_via_embedding: bool
) -> tuple[dict[str, HfTensor], list[str]]:
  """Lists an HF T5 checkpoint under t5x names, reading no weights.

  Args:
    path: an HF checkpoint directory or weight file (see `find_files`).
    logits_via_embedding: whether the model computes logits through the
      token embedding (T5 1.0); a tied `lm_head.weight` is then dropped.

  Returns:
    t5x name -> HfTensor; and notes explaining names that will not fit
    (for the mismatch error).

  Raises:
    CheckpointFormatError: if `path` holds no HF weight file.
  """
  files = find_files(path)
  if not files:
    raise validate.CheckpointFormatError(
        f"No Hugging Face weights at {path}: expected one of "
        f"{', '.join(FILE_NAMES)}."
    )
  stored = {}
  for file in files:
    stored.update(_list_file(file))
  notes = []
  if logits_via_embedding and _LM_HEAD in stored:
    if _tied(stored):
      del stored[_LM_HEAD]
    else:
      notes.append(
          f"{_LM_HEAD} differs from {_SHARED}: the checkpoint has its own "
          f"logits layer (T5 1.1), but the model computes logits through the "
          f"embedding (T5 1.0)"
      )
  params = {}
  for hf_name, tensor in stored.items():
    mapped = t5x_name(hf_name)
    if mapped is not None:
      name, transpose = mapped
      params[name] = dataclasses.replace(tensor, transpose=transpose)
  return params, notes


def _tied(stored: dict[str, HfTensor]) -> bool:
  """Whether lm_head.weight equals shared.weight (read as stored)."""
  if _SHARED not in stored:
    return False
  lm_head = stored[_LM_HEAD].read_stored()
  shared = stored[_SHARED].read_stored()
  return lm_head.shape == shared.shape and np.array_equal(lm_head, shared)
