"""T5's decoder stack over T new positions, writing them into the cache.

Causal self-attention over the cache, cross-attention to the encoded input
and an MLP per layer, then the logits: through the tied embedding (T5 1.0) or
`logits_dense` (T5 1.1).
"""

from flax import linen as nn
import jax.numpy as jnp

from spec_decode.models import attention
from spec_decode.models import decode_cache
from spec_decode.models import layers
from spec_decode.models.config import T5Config


class DecoderLayer(nn.Module):
  """Causal self-attention, cross-attention and MLP."""

  config: T5Config

  def setup(self):
    cfg = self.config
    dtype = cfg.activation_dtype
    self.pre_self_attention_layer_norm = layers.RmsNorm(dtype)
    self.self_attention = attention.MultiHeadAttention(
        cfg.num_heads,
        cfg.head_dim,
        cfg.emb_dim,
        dtype,
        transposed_kernels=cfg.transposed_kernels,
        few_rows_kernel=cfg.few_rows_kernel,
        per_query=cfg.per_query_attention,
        kernel=cfg.attention_kernel,
    )
    self.pre_cross_attention_layer_norm = layers.RmsNorm(dtype)
    self.encoder_decoder_attention = attention.MultiHeadAttention(
        cfg.num_heads,
        cfg.head_dim,
        cfg.emb_dim,
        dtype,
        transposed_kernels=cfg.transposed_kernels,
        few_rows_kernel=cfg.few_rows_kernel,
        per_query=cfg.per_query_attention,
        kernel=cfg.attention_kernel,
    )
    self.pre_mlp_layer_norm = layers.RmsNorm(dtype)
    self.mlp = layers.Mlp(
        cfg.mlp_dim,
        cfg.mlp_activations,
        dtype,
        transposed_kernels=cfg.transposed_kernels,
        few_rows_kernel=cfg.few_rows_kernel,
    )
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
      cached: (keys [B, H, D, L], values [B, H, L, D]), to write the new positions
        into, of which the first K are attended (K <= L, the key positions
        of `bias`); or None to attend among the T positions alone (K = T).
      positions: int32 [B, T], where the new positions go in `cached`.
      deterministic: disables dropout.

    Returns:
      The outputs [B, T, E] and the updated (keys, values), or None.
    """
    h = self.pre_self_attention_layer_norm(x)
    keys, values = self.self_attention.project_key_value(h)
    if cached is not None:
      # Overwrite at explicit positions; writes past capacity are dropped.
      cached = decode_cache.write(*cached, keys, values, positions)
      keys, values = cached
      num_keys = bias.shape[-1]
      if num_keys < values.shape[2]:
        keys, values = keys[..., :num_keys], values[:, :, :num_keys]
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
          transposed=cfg.transposed_kernels,
          few_rows=cfg.few_rows_kernel,
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
      key_positions: int32 [K], the positions of the attended keys: the
        cache's first K (K may be under its capacity).
      cross: per layer, the cross-attention (keys, values).
      encoder_mask: bool [B, S].
      cached: per layer, (keys [B, H, D, L], values [B, H, L, D]), or None when the
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
