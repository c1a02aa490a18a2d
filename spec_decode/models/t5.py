"""T5 (1.0 and 1.1) with t5x's parameter tree and a multi-token KV cache.

The parameter tree is t5x's (`t5x/examples/t5/network.py`) name for name, so a
T5X checkpoint maps one to one: `token_embedder/embedding`,
`encoder/layers_0/attention/query/kernel`, `decoder/relpos_bias/rel_embedding`,
`decoder/logits_dense/kernel`, ...

Decoding differs from t5x's one-token cache: `decode(tokens[B, T], cache)`
appends T tokens to each row at that row's own length, so the same call is an
ordinary step (T = 1) and a speculative verification pass (T = gamma + 1).
Keys and values are written at explicit positions (overwrite) and masked beyond
each row's length, so a rollback is `cache.replace(lengths=...)`.

Usage:
  model = Transformer(config)
  encoded = model.apply(variables, inputs, method=Transformer.encode)
  cache = model.apply(variables, encoded, inputs, max_len,
                      method=Transformer.init_cache)
  logits, cache = model.apply(variables, tokens, cache,
                              method=Transformer.decode)
"""

import functools
from typing import Any

from flax import linen as nn
from flax import struct
import jax
import jax.numpy as jnp

from spec_decode.models import decode_cache
from spec_decode.models import decoder
from spec_decode.models import encoder
from spec_decode.models import layers
from spec_decode.models.config import T5Config


class Transformer(nn.Module):
  """The T5 encoder-decoder."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = layers.Embed(
        cfg.vocab_size, cfg.emb_dim, cfg.activation_dtype
    )
    if cfg.shared_encoder_dim:
      self.encoder_projection = layers.Dense(
          cfg.emb_dim,
          ("encoder_embed", "embed"),
          cfg.activation_dtype,
          transposed=cfg.transposed_kernels,
          few_rows=cfg.few_rows_kernel,
      )
    else:
      self.encoder = encoder.Encoder(cfg, self.token_embedder)
    self.decoder = decoder.Decoder(cfg, self.token_embedder)

  def encode(
      self, encoder_input_tokens, enable_dropout=False, target_encoded=None
  ):
    """int32 [B, S] (0 = padding) -> encoded [B, S, E].

    A shared-encoder draft (config.shared_encoder_dim > 0) runs no encoder:
    its encoding is `target_encoded`, its target's `encode` of the same
    tokens, [B, S, shared_encoder_dim], projected to its own width.
    """
    if not self.config.shared_encoder_dim:
      if target_encoded is not None:
        raise ValueError("target_encoded is for a shared-encoder draft only")
      return self.encoder(
          encoder_input_tokens, deterministic=not enable_dropout
      )
    if target_encoded is None:
      raise ValueError(
          "a shared-encoder draft needs its target's encoder output "
          "(target_encoded)"
      )
    return self.encoder_projection(target_encoded)

  def init_cache(self, encoded, encoder_input_tokens, max_length):
    """An empty cache of `max_length` decoder positions per row.

    Args:
      encoded: [B, S, E], from `encode`.
      encoder_input_tokens: int32 [B, S], for the padding mask.
      max_length: the cache's capacity; a speculative decoder needs
        max_decode_len + gamma + 1.

    Returns:
      A DecodeCache with lengths 0.
    """
    cfg = self.config
    batch = encoded.shape[0]
    cross = self.decoder.cross_key_values(encoded)

    def zeros(*shape):
      return tuple(
          jnp.zeros(shape, cfg.activation_dtype)
          for _ in range(cfg.num_decoder_layers)
      )

    heads, head_dim = cfg.num_heads, cfg.head_dim
    return decode_cache.DecodeCache(
        keys=zeros(batch, heads, head_dim, max_length),
        values=zeros(batch, heads, max_length, head_dim),
        cross_keys=tuple(k for k, _ in cross),
        cross_values=tuple(v for _, v in cross),
        encoder_mask=encoder_input_tokens > 0,
        lengths=jnp.zeros((batch,), jnp.int32),
        key_buckets=cfg.attention_buckets,
    )

  def decode(self, tokens, cache):
    """Appends T tokens to every row at the row's own length.

    Query t of row b sits at position cache.lengths[b] + t and attends to the
    cached positions up to and including its own.

    Args:
      tokens: int32 [B, T].
      cache: a DecodeCache with room for lengths + T positions.

    Returns:
      float32 logits [B, T, V] (logits[:, t] predicts the token after
      tokens[:, t]) and the cache with the tokens written and lengths + T.
    """
    num_new = tokens.shape[1]
    positions = cache.lengths[:, None] + jnp.arange(num_new)[None, :]  # [B, T]
    logits, cached = self.decoder(
        tokens,
        positions,
        jnp.arange(cache.max_length),
        list(zip(cache.cross_keys, cache.cross_values)),
        cache.encoder_mask,
        cached=list(zip(cache.keys, cache.values)),
    )
    cache = cache.replace(
        keys=tuple(k for k, _ in cached),
        values=tuple(v for _, v in cached),
        lengths=cache.lengths + num_new,
    )
    return logits, cache

  def __call__(
      self,
      encoder_input_tokens,
      decoder_input_tokens,
      enable_dropout=False,
      target_encoded=None,
  ):
    """Teacher-forced logits: int32 [B, S] and [B, T] -> float32 [B, T, V].

    `target_encoded` is a shared-encoder draft's input (see `encode`).
    """
    encoded = self.encode(encoder_input_tokens, enable_dropout, target_encoded)
    return self.decode_forced(
        encoded, encoder_input_tokens, decoder_input_tokens, enable_dropout
    )

  def decode_forced(
      self,
      encoded,
      encoder_input_tokens,
      decoder_input_tokens,
      enable_dropout=False,
  ):
    """Teacher-forced logits from an encoding: float32 [B, T, V].

    Args:
      encoded: [B, S, E], from `encode`.
      encoder_input_tokens: int32 [B, S], for the padding mask.
      decoder_input_tokens: int32 [B, T].
      enable_dropout: enables dropout.
    """
    positions = jnp.arange(decoder_input_tokens.shape[1])
    logits, _ = self.decoder(
        decoder_input_tokens,
        positions[None, :],
        positions,
        self.decoder.cross_key_values(encoded),
        encoder_input_tokens > 0,
        deterministic=not enable_dropout,
    )
    return logits


def _init_variables(config, rng):
  model = Transformer(config)
  dummy = jnp.ones((1, 1), jnp.int32)
  target_encoded = None
  if config.shared_encoder_dim:
    target_encoded = jnp.ones((1, 1, config.shared_encoder_dim))
  return model.init(rng, dummy, dummy, target_encoded=target_encoded)


def init_params(config, rng):
  """Random parameters: the t5x tree of float32 arrays."""
  return nn.meta.unbox(_init_variables(config, rng)["params"])


@functools.lru_cache(maxsize=32)
def _abstract_variables(config):
  """`_init_variables` traced for its shapes and metadata, once a config.

  Tracing a model's init takes about a second on a CPU core (T5 1.1 XXL's
  more), and loading a checkpoint asks for the shapes and the axes of each
  model several times. Callers get new trees (`unbox`, `get_partition_spec`
  map over it), so the cached one is never changed.
  """
  return jax.eval_shape(
      functools.partial(_init_variables, config), jax.random.key(0)
  )


def param_shapes(config):
  """The parameter tree as jax.ShapeDtypeStruct leaves, computing nothing."""
  return nn.meta.unbox(_abstract_variables(config)["params"])


def param_logical_axes(config):
  """The parameter tree with each leaf's logical axis names, a PartitionSpec."""
  return nn.get_partition_spec(_abstract_variables(config))["params"]


def transpose_kernels(params):
  """Every projection's kernel (a leaf named 'kernel') transposed, [N, K].

  t5x's tree, as checkpoints store it, into the layout of a config with
  `transposed_kernels`; the same function maps it back.
  """
  transposed = {}
  for name, value in params.items():
    if isinstance(value, dict):
      transposed[name] = transpose_kernels(value)
    else:
      transposed[name] = value.T if name == "kernel" else value
  return transposed


def num_params(config):
  """The number of parameters of a config."""
  return sum(x.size for x in jax.tree.leaves(param_shapes(config)))


@struct.dataclass
class BoundDecoder:
  """`Transformer.decode` with its parameters bound in, as a pytree.

  The parameters are leaves, so jitted loops take them as arguments rather
  than compiling them in as constants; the module is static, and equal
  configs share one compilation.

  Attributes:
    model: the Transformer.
    params: its parameter tree.
  """

  model: Transformer = struct.field(pytree_node=False)
  params: Any

  def logical_axes(self):
    """The same structure with the parameters' logical axes."""
    return BoundDecoder(self.model, param_logical_axes(self.model.config))

  def __call__(self, tokens, cache):
    """(int32 [B, T], cache) -> (float32 logits [B, T, V], cache)."""
    return self.model.apply(
        {"params": self.params}, tokens, cache, method=Transformer.decode
    )


def make_decode_fn(model, params):
  """Binds params: (tokens [B, T], cache) -> (logits [B, T, V], cache)."""
  return BoundDecoder(model, params)
