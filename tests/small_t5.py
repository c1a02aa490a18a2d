"""Small T5 models of both families, for the tests of models/t5.py.

`config(family)` is a T5 1.1 ("t5_1_1") or T5 1.0 ("t5_1_0") config with a
2-layer encoder and a 3-layer decoder; `jitted_decode(model)` is the model's
cached decode call, compiled once per model.
"""

import dataclasses
import functools

import jax

from spec_decode.models import t5

# Cached and full passes sum the same terms in a different order.
ATOL = 1e-5


def config(family):
  t5_1_1 = t5.T5Config(
      vocab_size=97,
      emb_dim=16,
      num_heads=4,
      head_dim=8,
      mlp_dim=32,
      num_encoder_layers=2,
      num_decoder_layers=3,
  )
  if family == "t5_1_1":
    return t5_1_1
  # T5 1.0: a ReLU MLP, and logits through the shared embedding.
  return dataclasses.replace(
      t5_1_1, mlp_activations=("relu",), logits_via_embedding=True
  )


@functools.cache
def jitted_decode(model):
  return jax.jit(
      lambda params, tokens, cache: model.apply(
          {"params": params}, tokens, cache, method=model.decode
      )
  )
