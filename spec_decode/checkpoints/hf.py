"""Hugging Face T5 checkpoints (`T5ForConditionalGeneration`) as t5x params.

Reads `model.safetensors`, sharded `model.safetensors.index.json`,
`pytorch_model.bin` and sharded `pytorch_model.bin.index.json` (the last two
only when torch is installed; they are opened with `weights_only=True` and
memory-mapped), and Flax's `flax_model.msgpack` (FlaxT5ForConditionalGeneration,
as transformers 4 wrote it). A shard named on its own stands for the index
that lists it.

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

Flax names the same tensors with '.'-joined module paths; its Dense layers
hold `kernel` [in, out] (a torch weight transposed) and its embeddings
`embedding` (the torch weight as it is), so `shared.embedding` is
`shared.weight` and `...SelfAttention.q.kernel` is `...SelfAttention.q.weight`
already transposed.

Memory: tensors are listed from the files' headers, then read one at a time
(safetensors through `safe_open`, torch files memory-mapped), cast and
transposed, so only one tensor is in flight beside the loaded parameters. A
Flax msgpack file has no header: it is decoded whole, each array cast to the
requested dtype as it is read.
"""

import dataclasses
import json
import os
import re
from typing import Any

import numpy as np

from spec_decode.checkpoints import hf_config
from spec_decode.checkpoints import hf_files
from spec_decode.checkpoints import validate

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"
FLAX = "flax_model.msgpack"
FLAX_INDEX = "flax_model.msgpack.index.json"
# In order of preference when a directory holds several.
FILE_NAMES = (SAFETENSORS_INDEX, SAFETENSORS, TORCH_INDEX, TORCH, FLAX)
# Indexes of sharded checkpoints, which a lone shard stands for.
_INDEXES = (SAFETENSORS_INDEX, TORCH_INDEX)
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
  """The weight files of an HF checkpoint (a directory or one file in it).

  Args:
    path: a local directory holding one of FILE_NAMES, or one such file (a
      shard index, a `.safetensors`, `.bin` or `flax_model.msgpack` file), or
      the `config.json` of such a directory.

  Returns:
    The files to read (the shards an index lists, all of them when `path` is
    one shard an index lists, or the one file); empty if `path` is not an HF
    checkpoint.

  Raises:
    CheckpointFormatError: `path` is a sharded Flax checkpoint (and has no
      other weights).
  """
  if os.path.isdir(path):
    for name in FILE_NAMES:
      if os.path.isfile(os.path.join(path, name)):
        return find_files(os.path.join(path, name))
    if os.path.isfile(os.path.join(path, FLAX_INDEX)):
      raise validate.CheckpointFormatError(
          f"{path} is a sharded Hugging Face Flax checkpoint ({FLAX_INDEX}), "
          f"which spec_decode does not read; save it with safetensors."
      )
    return []
  if os.path.basename(path) == hf_config.CONFIG_FILE:
    return find_files(os.path.dirname(path) or ".")
  if path.endswith(".index.json"):
    return _shards(path)
  if path.endswith((".safetensors", ".bin")):
    index = _index_listing(path)
    return _shards(index) if index else [path]
  if os.path.basename(path) == FLAX:
    return [path]
  return []


def _shards(index: str) -> list[str]:
  """The files a shard index lists."""
  try:
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise validate.CheckpointFormatError(
        f"{index} is not a Hugging Face shard index: {e!r}"
    ) from e
  directory = os.path.dirname(index)
  return [
      os.path.join(directory, name) for name in sorted(set(weight_map.values()))
  ]


def _index_listing(shard: str) -> str | None:
  """The shard index beside `shard` that lists it, if any."""
  directory = os.path.dirname(shard)
  for index_name in _INDEXES:
    index = os.path.join(directory, index_name)
    if os.path.isfile(index) and shard in _shards(index):
      return index
  return None


def list_params(
    path: str, logits_via_embedding: bool, dtype=None
) -> tuple[dict[str, hf_files.HfTensor], list[str]]:
  """Lists an HF T5 checkpoint under t5x names, reading no weights.

  Args:
    path: an HF checkpoint directory or weight file (see `find_files`).
    logits_via_embedding: whether the model computes logits through the
      token embedding (T5 1.0); a tied `lm_head.weight` is then dropped.
      Otherwise a checkpoint without `lm_head.weight` whose `config.json`
      ties it to the embedding without T5 1.0's rescaling (as transformers 5
      saves a T5 1.1 built from a config) reads `shared.weight` for it.
    dtype: what a Flax file's arrays are cast to as they are decoded.

  Returns:
    t5x name -> HfTensor; and notes explaining names that will not fit
    (for the mismatch error).

  Raises:
    CheckpointFormatError: if `path` holds no HF weight file.
  """
  stored = _list_stored(path, dtype)
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
  if not logits_via_embedding and _lm_head_is_shared(path, stored):
    params[_LOGITS] = dataclasses.replace(stored[_SHARED], transpose=True)
  for hf_name, tensor in stored.items():
    mapped = t5x_name(hf_name)
    if mapped is not None:
      name, transpose = mapped
      params[name] = dataclasses.replace(
          tensor, transpose=transpose != tensor.kernel
      )
  return params, notes


def _list_stored(path: str, dtype=None) -> dict[str, hf_files.HfTensor]:
  """Every tensor of the checkpoint's weight files, by torch name."""
  files = find_files(path)
  if not files:
    raise validate.CheckpointFormatError(
        f"No Hugging Face weights at {path}: expected one of "
        f"{', '.join(FILE_NAMES)}."
    )
  stored = {}
  for file in files:
    stored.update(hf_files.list_file(file, dtype))
  return stored


def _lm_head_is_shared(path: str, stored: dict[str, Any]) -> bool:
  """Whether config.json ties a missing lm_head to shared, unscaled."""
  config_file = hf_config.find(path)
  if _LM_HEAD in stored or _SHARED not in stored or config_file is None:
    return False
  config = hf_config.read(config_file)
  return bool(
      config.get("tie_word_embeddings", True)
  ) and not hf_config.logits_via_embedding(config)


def stored_dtype(path: str) -> str:
  """The dtype to compute in for the checkpoint's stored weights.

  Args:
    path: an HF checkpoint directory or weight file.

  Returns:
    'bfloat16' when every floating-point tensor is stored in bfloat16, else
    'float32' (float16 weights too: T5's activations overflow float16).
  """
  dtypes = {
      tensor.dtype
      for tensor in _list_stored(path).values()
      if tensor.dtype.startswith(("float", "bfloat"))
  }
  return "bfloat16" if dtypes == {"bfloat16"} else "float32"


def _tied(stored: dict[str, hf_files.HfTensor]) -> bool:
  """Whether lm_head.weight equals shared.weight (read as stored)."""
  if _SHARED not in stored:
    return False
  lm_head = stored[_LM_HEAD].read_stored()
  shared = stored[_SHARED].read_stored()
  return lm_head.shape == shared.shape and np.array_equal(lm_head, shared)
