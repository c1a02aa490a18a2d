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

from spec_decode.models import cache_writes
from spec_decode.models import layers
from spec_decode.models.config import T5Config


@struct.dataclass
class DecodeCache:
  """The decoder's state for a batch of rows.

  L is the cache's capacity in decoder positions, S the encoder's length.
  Keys are [B, H, D, L] and values [B, H, L, D]: the layouts attention reads
  without a transpose or copy (`layers.dot_product_attention`).

  Attributes:
    keys: one [B, H, D, L] array of self-attention keys per decoder layer.
    values: one [B, H, L, D] array of self-attention values per layer.
    cross_keys: one [B, H, D, S] array per layer, projected once from the
      encoder's output.
    cross_values: one [B, H, S, D] array per layer.
    encoder_mask: bool [B, S], True at the real (non-padding) input tokens.
    lengths: int32 [B], the decoder tokens written for each row. Positions at
      or beyond a row's length are masked and free to be overwritten.
  """

  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  cross_keys: tuple[jax.Array, ...]
  cross_values: tuple[jax.Array, ...]
  encoder_mask: jax.Array
  lengths: jax.Array

  @property
  def max_length(self):
    return self.values[0].shape[2]

  def logical_axes(self):
    """This cache's structure with each leaf's logical axes, a PartitionSpec."""
    k = jax.sharding.PartitionSpec(
        "cache_batch", "cache_heads", "cache_kv", "cache_sequence"
    )
    v = jax.sharding.PartitionSpec(
        "cache_batch", "cache_heads", "cache_sequence", "cache_kv"
    )
    keys = tuple(k for _ in self.keys)
    values = tuple(v for _ in self.values)
    return DecodeCache(
        keys=keys,
        values=values,
        cross_keys=keys,
        cross_values=values,
        encoder_mask=jax.sharding.PartitionSpec("cache_batch", None),
        lengths=jax.sharding.PartitionSpec("cache_batch"),
    )


class EncoderLayer(nn.Module):
  """Self-attention and MLP, each pre-normed and residual."""

  config: T5Config

  def setup(self):
    cfg = self.config
    dtype = cfg.activation_dtype
    self.pre_attention_layer_norm = layers.RmsNorm(dtype)
    self.attention = layers.MultiHeadAttention(
        cfg.num_heads, cfg.head_dim, cfg.emb_dim, dtype
    )
    self.pre_mlp_layer_norm = layers.RmsNorm(dtype)
    self.mlp = layers.Mlp(cfg.mlp_dim, cfg.mlp_activations, dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

  def __call__(self, x, bias, mask, deterministic):
    """[B, S, E] -> [B, S, E]."""
    h = self.pre_attention_layer_norm(x)
    keys, values = self.attention.project_key_value(h)
    h = self.attention.attend(
        self.attention.project_query(h), keys, values, bias, mask
    )
    x = x + self.dropout(h, deterministic=deterministic)
    h = self.mlp(self.pre_mlp_layer_norm(x))
    return x + self.dropout(h, deterministic=deterministic)


class Encoder(nn.Module):
  """The encoder stack, with one bidirectional position-bias table."""

  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = layers.RelativePositionBias(
        cfg.num_heads,
        cfg.num_buckets,
        cfg.max_distance,
        bidirectional=True,
        dtype=cfg.activation_dtype,
    )
    self.layers = [EncoderLayer(cfg) for _ in range(cfg.num_encoder_layers)]
    self.encoder_norm = layers.RmsNorm(cfg.activation_dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

  def __call__(self, tokens, deterministic=True):
    """Encodes int tokens [B, S] (0 = padding) -> [B, S, E]."""
    positions = jnp.arange(tokens.shape[1])
    bias = self.relpos_bias(positions[None, :], positions)  # [1, H, S, S]
    valid = tokens > 0
    mask = valid[:, None, :, None] & valid[:, None, None, :]  # [B, 1, S, S]
    x = self.dropout(self.shared_embedding(tokens), deterministic=deterministic)
    for layer in self.layers:
      x = layer(x, bias, mask, deterministic)
    x = self.encoder_norm(x)
    return self.dropout(x, deterministic=deterministic)


class DecoderLayer(nn.Module):
  """Causal self-attention, cross-attention and MLP."""

  config: T5Config

  def setup(self):
    cfg = self.config
    dtype = cfg.activation_dtype
    self.pre_self_attention_layer_norm = layers.RmsNorm(dtype)
    self.self_attention = layers.MultiHeadAttention(
        cfg.num_heads, cfg.head_dim, cfg.emb_dim, dtype
    )
    self.pre_cross_attention_layer_norm = layers.RmsNorm(dtype)
    self.encoder_decoder_attention = layers.MultiHeadAttention(
        cfg.num_heads, cfg.head_dim, cfg.emb_dim, dtype
    )
    self.pre_mlp_layer_norm = layers.RmsNorm(dtype)
    self.mlp = layers.Mlp(cfg.mlp_dim, cfg.mlp_activations, dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

  def cross_key_values(self, encoded):
    """[B, S, E] -> cross-attention keys [B, H, D, S], values [B, H, S, D]."""
    return self.encoder_decoder_attention.project_key_value(encoded)

  def __call__(
      self,
      x,
      bias,
      self_mask,
      cross,
      cross_mask,
      cached,
      positions,
      deterministic,
  ):
    """One layer over T new positions.

    Args:
      x: [B, T, E], the new positions' inputs.
      bias: [B or 1, H, T, K], the self-attention position bias.
      self_mask: bool [B or 1, 1, T, K].
      cross: (keys [B, H, D, S], values [B, H, S, D]).
      cross_mask: bool [B, 1, 1, S].
      cached: (keys [B, H, D, K], values [B, H, K, D]), to write the new positions
        into; or None to attend among the T positions alone (then K = T).
      positions: int32 [B, T], where the new positions go in `cached`.
      deterministic: disables dropout.

    Returns:
      The outputs [B, T, E] and the updated (keys, values), or None.
    """
    h = self.pre_self_attention_layer_norm(x)
    keys, values = self.self_attention.project_key_value(h)
    if cached is not None:
      # Overwrite at explicit positions; writes past capacity are dropped.
      cached = cache_writes.write(*cached, keys, values, positions)
      keys, values = cached
    h = self.self_attention.attend(
        self.self_attention.project_query(h), keys, values, bias, self_mask
    )
    x = x + self.dropout(h, deterministic=deterministic)
    h = self.pre_cross_attention_layer_norm(x)
    h = self.encoder_decoder_attention.attend(
        self.encoder_decoder_attention.project_query(h),
        *cross,
        None,
        cross_mask
    )
    x = x + self.dropout(h, deterministic=deterministic)
    h = self.mlp(self.pre_mlp_layer_norm(x))
    return x + self.dropout(h, deterministic=deterministic), cached


class Decoder(nn.Module):
  """The decoder stack, with one causal position-bias table, and the logits."""

  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = layers.RelativePositionBias(
        cfg.num_heads,
        cfg.num_buckets,
        cfg.max_distance,
        bidirectional=False,
        dtype=cfg.activation_dtype,
    )
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)]
    self.decoder_norm = layers.RmsNorm(cfg.activation_dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    if not cfg.logits_via_embedding:
      # Logits in float32 (by default) for stable softmax and sampling,
      # accumulated from the kernel as stored: no float32 copy of it.
      logits_dtype = jnp.dtype(cfg.logits_dtype)
      self.logits_dense = layers.Dense(
          cfg.vocab_size,
          ("embed", "vocab"),
          logits_dtype,
          widening_to=logits_dtype if logits_dtype == jnp.float32 else None,
      )

  def cross_key_values(self, encoded):
    """Per layer, the cross-attention keys [B, H, D, S], values [B, H, S, D]."""
    return [layer.cross_key_values(encoded) for layer in self.layers]

  def __call__(
      self,
      tokens,
      positions,
      key_positions,
      cross,
      encoder_mask,
      cached=None,
      deterministic=True,
  ):
    """Runs T new decoder positions.

    Args:
      tokens: int32 [B, T].
      positions: int32 [B or 1, T], the absolute position of each token.
      key_positions: int32 [K], the positions of the attended keys.
      cross: per layer, the cross-attention (keys, values).
      encoder_mask: bool [B, S].
      cached: per layer, (keys [B, H, D, K], values [B, H, K, D]), or None when the
        T tokens are the whole sequence (then K = T).
      deterministic: disables dropout.

    Returns:
      float32 logits [B, T, V], and the updated per-layer caches (or None).
    """
    cfg = self.config
    bias = self.relpos_bias(positions, key_positions)  # [B or 1, H, T, K]
    self_mask = key_positions[None, None, :] <= positions[:, :, None]
    self_mask = self_mask[:, None]  # [B or 1, 1, T, K]
    cross_mask = encoder_mask[:, None, None, :]  # [B, 1, 1, S]
    write_positions = jnp.broadcast_to(positions, tokens.shape)
    x = self.dropout(self.shared_embedding(tokens), deterministic=deterministic)
    new_cached = []
    for i, layer in enumerate(self.layers):
      x, layer_cached = layer(
          x,
          bias,
          self_mask,
          cross[i],
          cross_mask,
          None if cached is None else cached[i],
          write_positions,
          deterministic,
      )
      new_cached.append(layer_cached)
    x = self.dropout(self.decoder_norm(x), deterministic=deterministic)
    if cfg.logits_via_embedding:
      logits = self.shared_embedding.attend(x) / jnp.sqrt(cfg.emb_dim)
    else:
      logits = self.logits_dense(x)
    return logits, (None if cached is None else new_cached)


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
          cfg.emb_dim, ("encoder_embed", "embed"), cfg.activation_dtype
      )
    else:
      self.encoder = Encoder(cfg, self.token_embedder)
    self.decoder = Decoder(cfg, self.token_embedder)

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
    return DecodeCache(
        keys=zeros(batch, heads, head_dim, max_length),
        values=zeros(batch, heads, max_length, head_dim),
        cross_keys=tuple(k for k, _ in cross),
        cross_values=tuple(v for _, v in cross),
        encoder_mask=encoder_input_tokens > 0,
        lengths=jnp.zeros((batch,), jnp.int32),
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


def param_shapes(config):
  """The parameter tree as jax.ShapeDtypeStruct leaves, computing nothing."""
  variables = jax.eval_shape(
      functools.partial(_init_variables, config), jax.random.key(0)
  )
  return nn.meta.unbox(variables["params"])


def param_logical_axes(config):
  """The parameter tree with each leaf's logical axis names, a PartitionSpec."""
  variables = jax.eval_shape(
      functools.partial(_init_variables, config), jax.random.key(0)
  )
  return nn.get_partition_spec(variables)["params"]


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
