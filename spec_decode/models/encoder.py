"""T5's encoder stack: bidirectional self-attention and an MLP per layer."""

from flax import linen as nn
import jax.numpy as jnp

from spec_decode.models import attention
from spec_decode.models import layers
from spec_decode.models.config import T5Config


class EncoderLayer(nn.Module):
  """Self-attention and MLP, each pre-normed and residual."""

  config: T5Config

  def setup(self):
    cfg = self.config
    dtype = cfg.activation_dtype
    self.pre_attention_layer_norm = layers.RmsNorm(dtype)
    self.attention = attention.MultiHeadAttention(
        cfg.num_heads,
        cfg.head_dim,
        cfg.emb_dim,
        dtype,
        transposed_kernels=cfg.transposed_kernels,
        few_rows_kernel=cfg.few_rows_kernel,
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
