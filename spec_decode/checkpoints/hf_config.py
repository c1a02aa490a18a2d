"""A Hugging Face checkpoint's `config.json` as `T5Config` fields.

transformers writes the architecture of a saved model to `config.json` beside
its weights. The fields map as follows (HF name -> T5Config name):

  vocab_size                       -> vocab_size
  d_model                          -> emb_dim
  num_heads                        -> num_heads
  d_kv                             -> head_dim
  d_ff                             -> mlp_dim
  num_layers                       -> num_encoder_layers
  num_decoder_layers               -> num_decoder_layers (num_layers if null)
  feed_forward_proj                -> mlp_activations ('gated-gelu' is
                                      ('gelu', 'linear'), 'relu' is ('relu',))
  scale_decoder_outputs, else
  tie_word_embeddings (not mT5)    -> logits_via_embedding
  relative_attention_num_buckets   -> num_buckets
  relative_attention_max_distance  -> max_distance

Absent fields take transformers' defaults, as transformers itself does when it
loads the file (T5 1.0's files predate `feed_forward_proj` and
`relative_attention_max_distance`). T5 1.0 (t5-small..11b), T5 1.1 (t5-v1_1,
Flan-T5) and mT5 (T5 1.1 with 250,112 ids) have this architecture; umT5
(a relative-position bias in every layer), LongT5 (local and transient-global
attention) and anything else are refused by name.
"""

import json
import os
from typing import Any

from spec_decode.checkpoints import validate

CONFIG_FILE = "config.json"
# model_type values whose models this code implements exactly.
_T5_TYPES = ("t5", "mt5")
# model_type values of T5 variants this code refuses, and what they are.
_REFUSED_TYPES = {
    "umt5": (
        "umT5, which has a relative-position bias in every layer (this code "
        "implements T5's one bias per stack)"
    ),
    "longt5": (
        "LongT5, whose encoder uses local or transient-global attention (this "
        "code implements T5's full attention)"
    ),
}
# Classes that hold an encoder-decoder with a language-model head
# (T5WithLMHeadModel: T5ForConditionalGeneration's name in transformers 2).
_ARCHITECTURES = (
    "T5ForConditionalGeneration",
    "MT5ForConditionalGeneration",
    "T5WithLMHeadModel",
)
# Special ids this code's decoders use (spec_decode.inputs); a checkpoint with
# others would decode with the wrong ones.
_TOKEN_IDS = {"pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}
# T5's RMS norm epsilon (models/layers.py).
_LAYER_NORM_EPSILON = 1e-6
# feed_forward_proj's activation name -> the MLP activation of models/layers.py
# that computes the same function. transformers maps 'gated-gelu' to its
# tanh-approximated 'gelu_new', which is flax's nn.gelu; a plain 'gelu' is
# the exact erf GELU, which this code does not implement.
_ACTIVATIONS = {"relu": "relu", "gelu_new": "gelu", "silu": "silu"}


def find(path: str) -> str | None:
  """The `config.json` beside an HF checkpoint (a directory or a file in it)."""
  directory = path if os.path.isdir(path) else os.path.dirname(path)
  candidate = os.path.join(directory, CONFIG_FILE)
  return candidate if os.path.isfile(candidate) else None


def read(config_file: str) -> dict[str, Any]:
  """The JSON object in `config_file`; a one-line error if it is not one."""
  try:
    with open(config_file) as f:
      hf = json.load(f)
  except (OSError, ValueError) as e:
    raise validate.CheckpointFormatError(
        f"Cannot read {config_file}: {e}"
    ) from e
  if not isinstance(hf, dict):
    raise validate.CheckpointFormatError(f"{config_file} is not a JSON object")
  return hf


def _check_model_type(hf: dict[str, Any], source: str) -> None:
  model_type = hf.get("model_type")
  architectures = hf.get("architectures") or ()
  if model_type is None and architectures:
    model_type = "t5"  # Files older than model_type name their class only.
  if model_type in _REFUSED_TYPES:
    raise validate.CheckpointFormatError(
        f"{source}: model_type '{model_type}' is {_REFUSED_TYPES[model_type]}; "
        f"spec_decode runs T5 1.0, T5 1.1 / Flan-T5 and mT5 only"
    )
  if model_type not in _T5_TYPES:
    raise validate.CheckpointFormatError(
        f"{source}: model_type {model_type!r} is not a T5 (expected one of "
        f"{', '.join(_T5_TYPES)})"
    )
  other = [a for a in architectures if a not in _ARCHITECTURES]
  if other:
    raise validate.CheckpointFormatError(
        f"{source}: architectures {other} is not an encoder-decoder with a "
        f"language-model head (expected {' or '.join(_ARCHITECTURES)})"
    )


def _activations(hf: dict[str, Any], source: str) -> tuple[str, ...]:
  """feed_forward_proj ('relu', 'gated-gelu', ...) as mlp_activations."""
  proj = hf.get("feed_forward_proj", "relu")
  parts = str(proj).split("-")
  gated = len(parts) == 2 and parts[0] == "gated"
  name = parts[-1]
  if gated and name == "gelu":
    name = "gelu_new"  # As transformers' T5Config does.
  if (
      len(parts) > 2
      or (len(parts) == 2 and not gated)
      or (name not in _ACTIVATIONS)
  ):
    raise validate.CheckpointFormatError(
        f"{source}: feed_forward_proj {proj!r} is not implemented here "
        f"(known: relu, gelu_new, silu, each optionally gated-)"
    )
  activation = _ACTIVATIONS[name]
  return (activation, "linear") if gated else (activation,)


def _check_constants(hf: dict[str, Any], source: str) -> None:
  """Refuses special ids and a norm epsilon other than this code's."""
  for key, value in _TOKEN_IDS.items():
    if hf.get(key, value) not in (value, [value], None):
      raise validate.CheckpointFormatError(
          f"{source}: {key} is {hf[key]}, but spec_decode decodes with "
          f"{key} {value} (T5's)"
      )
  epsilon = hf.get("layer_norm_epsilon", _LAYER_NORM_EPSILON)
  if epsilon != _LAYER_NORM_EPSILON:
    raise validate.CheckpointFormatError(
        f"{source}: layer_norm_epsilon is {epsilon}, but spec_decode's RMS "
        f"norm uses T5's {_LAYER_NORM_EPSILON}"
    )


def logits_via_embedding(hf: dict[str, Any]) -> bool:
  """Whether the model computes logits through the embedding, rescaled.

  transformers 4 rescales T5's decoder output by d_model**-0.5 when
  `tie_word_embeddings` (default true: T5 1.0); transformers 5 writes that
  choice as `scale_decoder_outputs`. mT5 never rescales.
  """
  if hf.get("model_type") == "mt5":
    return False
  scaled = hf.get("scale_decoder_outputs")
  return bool(hf.get("tie_word_embeddings", True) if scaled is None else scaled)


def t5_fields(hf: dict[str, Any], source: str) -> dict[str, Any]:
  """The T5Config fields of an HF T5 config.

  Args:
    hf: the parsed `config.json`.
    source: its path, for messages.

  Returns:
    {T5Config field: value} for every architecture field (all but dtype and
    dropout_rate).

  Raises:
    CheckpointFormatError: the config is not a T5 this code implements (the
      message names what it is), or lacks a field with no default.
  """
  _check_model_type(hf, source)
  _check_constants(hf, source)
  required = ("vocab_size", "d_model", "num_heads", "d_kv", "d_ff")
  missing = [key for key in required + ("num_layers",) if key not in hf]
  if missing:
    raise validate.CheckpointFormatError(f"{source} lacks {', '.join(missing)}")
  return {
      "vocab_size": int(hf["vocab_size"]),
      "emb_dim": int(hf["d_model"]),
      "num_heads": int(hf["num_heads"]),
      "head_dim": int(hf["d_kv"]),
      "mlp_dim": int(hf["d_ff"]),
      "num_encoder_layers": int(hf["num_layers"]),
      "num_decoder_layers": int(
          hf.get("num_decoder_layers") or hf["num_layers"]
      ),
      "mlp_activations": _activations(hf, source),
      "logits_via_embedding": logits_via_embedding(hf),
      "num_buckets": int(hf.get("relative_attention_num_buckets", 32)),
      "max_distance": int(hf.get("relative_attention_max_distance", 128)),
  }
