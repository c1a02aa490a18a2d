"""transformers' PyTorch T5, the reference implementation, built from ours.

transformers 5.x always ties lm_head to the token embedding in a newly built
T5; its tie_word_embeddings=False only turns off T5 1.0's output rescaling.
The published T5 1.1 checkpoints have a lm_head of their own, so
`untie_lm_head` gives T5 1.1 models one. `model_from_params` loads our t5x
parameter tree into transformers' model by a name map written here, apart
from spec_decode.checkpoints.
"""

import numpy as np
import torch
import transformers


def hf_config(config):
  """The transformers.T5Config of one of our T5Configs, without dropout."""
  gated = config.mlp_activations == ("gelu", "linear")
  return transformers.T5Config(
      vocab_size=config.vocab_size,
      d_model=config.emb_dim,
      d_kv=config.head_dim,
      d_ff=config.mlp_dim,
      num_layers=config.num_encoder_layers,
      num_decoder_layers=config.num_decoder_layers,
      num_heads=config.num_heads,
      relative_attention_num_buckets=config.num_buckets,
      relative_attention_max_distance=config.max_distance,
      feed_forward_proj="gated-gelu" if gated else "relu",
      tie_word_embeddings=config.logits_via_embedding,
      dropout_rate=0.0,
  )


def untie_lm_head(model, weight):
  """Gives a T5 1.1 `model` its own lm_head, `weight` [vocab, emb]."""
  model.lm_head.weight = torch.nn.Parameter(weight)
  model.all_tied_weights_keys.pop("lm_head.weight", None)


def hf_model(config):
  """A random transformers T5 of `config`, in eval mode (seeded)."""
  torch.manual_seed(0)
  model = transformers.T5ForConditionalGeneration(hf_config(config)).eval()
  if not config.logits_via_embedding:
    untie_lm_head(model, torch.randn(config.vocab_size, config.emb_dim))
  return model


def _hf_names(stack):
  """HF names of a block's sublayers.

  Args:
    stack: "encoder" or "decoder".

  Returns:
    {HF sublayer index: (HF attention, t5x attention, t5x norm)}, and the HF
    sublayer index of the MLP.
  """
  if stack == "encoder":
    return {0: ("SelfAttention", "attention", "pre_attention_layer_norm")}, 1
  return {
      0: ("SelfAttention", "self_attention", "pre_self_attention_layer_norm"),
      1: (
          "EncDecAttention",
          "encoder_decoder_attention",
          "pre_cross_attention_layer_norm",
      ),
  }, 2


def state_dict(config, params):
  """transformers' state dict holding our t5x-named `params` (numpy trees).

  Written out here, apart from spec_decode.checkpoints, so that a test of the
  model against transformers does not go through our own loader.

  Args:
    config: our T5Config.
    params: our parameter tree (nested dicts of arrays).

  Returns:
    name -> torch.Tensor (float32), for `load_state_dict`.
  """

  def tensor(x, transpose=False):
    x = np.asarray(x, np.float32)
    return torch.from_numpy(np.array(x.T if transpose else x, order="C"))

  out = {"shared.weight": tensor(params["token_embedder"]["embedding"])}
  out["encoder.embed_tokens.weight"] = out["shared.weight"]
  out["decoder.embed_tokens.weight"] = out["shared.weight"]
  if not config.logits_via_embedding:
    out["lm_head.weight"] = tensor(
        params["decoder"]["logits_dense"]["kernel"], transpose=True
    )
  else:
    out["lm_head.weight"] = out["shared.weight"]
  for stack, num_layers in (
      ("encoder", config.num_encoder_layers),
      ("decoder", config.num_decoder_layers),
  ):
    tree = params[stack]
    out[
        f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    ] = tensor(tree["relpos_bias"]["rel_embedding"], transpose=True)
    out[f"{stack}.final_layer_norm.weight"] = tensor(
        tree[f"{stack}_norm"]["scale"]
    )
    attentions, mlp_index = _hf_names(stack)
    for i in range(num_layers):
      layer = tree[f"layers_{i}"]
      block = f"{stack}.block.{i}.layer"
      for index, (hf_name, name, norm) in attentions.items():
        for short, long in (
            ("q", "query"),
            ("k", "key"),
            ("v", "value"),
            ("o", "out"),
        ):
          out[f"{block}.{index}.{hf_name}.{short}.weight"] = tensor(
              layer[name][long]["kernel"], transpose=True
          )
        out[f"{block}.{index}.layer_norm.weight"] = tensor(layer[norm]["scale"])
      for name, value in layer["mlp"].items():
        out[f"{block}.{mlp_index}.DenseReluDense.{name}.weight"] = tensor(
            value["kernel"], transpose=True
        )
      out[f"{block}.{mlp_index}.layer_norm.weight"] = tensor(
          layer["pre_mlp_layer_norm"]["scale"]
      )
  return out


def model_from_params(config, params):
  """transformers' T5 (eval, float32) with our `params` loaded, strictly."""
  model = hf_model(config)
  model.load_state_dict(state_dict(config, params), strict=True)
  return model


def logits(config, params, inputs, targets):
  """transformers' logits [B, T, V] for our `params` (see model_from_params).

  Args:
    config: our T5Config.
    params: our parameter tree.
    inputs: int [B, S] encoder inputs, 0 for padding.
    targets: int [B, T] decoder inputs (0 first).

  Returns:
    float32 numpy logits.
  """
  with torch.no_grad():
    return model_from_params(config, params)(
        input_ids=torch.from_numpy(np.asarray(inputs)).long(),
        attention_mask=torch.from_numpy(np.asarray(inputs) > 0).long(),
        decoder_input_ids=torch.from_numpy(np.asarray(targets)).long(),
    ).logits.numpy()
