"""transformers' PyTorch T5, the reference implementation, built from ours.

transformers 5.x always ties lm_head to the token embedding in a newly built
T5; its tie_word_embeddings=False only turns off T5 1.0's output rescaling.
The published T5 1.1 checkpoints have a lm_head of their own, so
`untie_lm_head` gives T5 1.1 models one.
"""

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
