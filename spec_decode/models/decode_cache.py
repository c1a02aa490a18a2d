"""The decoder's KV cache: its arrays, and how a call writes into them.

The cache holds, per decoder layer, self-attention keys [B, H, D, L] and
values [B, H, L, D] (the layouts attention's dots read as they are), the
cross-attention keys and values of the encoded input, and each row's length.

Each row writes its T new positions from its own length, so one call's rows
write at different places: a scatter. Two scatters write the same entries,
and compilers lay them out differently:

- per position: B x T updates, each a whole [H, D] slab. On a TPU compile
  this lets attention's dot and the write agree on the key cache's layout;
  one update per head instead made the compiler copy each layer's key cache
  in and out of the write at batch 32 (README, "Compiled for a TPU, with no
  TPU": 46.3 -> 23.1 GB accessed by T5 1.1 XXL's 1-token call).
- per head: B x H x T updates of D entries. At batch 1 the per-position
  scatter of one token is a single update, which XLA rewrites into a
  `dynamic_update_slice`, and XLA:CPU then copies each cache array several
  times per call; this form has H updates and is written in place.

Positions at or past the capacity are dropped.

A call attends every position of the cache it is given. The decode loops can
run one `lax.while_loop` per bucket of the capacity, each carrying the cache
cut to its bucket's bound (`spec_decode/key_buckets.py`).
"""

from flax import struct
import jax
import jax.numpy as jnp


@struct.dataclass
class DecodeCache:
  """The decoder's state for a batch of rows.

  L is the cache's capacity in decoder positions, S the encoder's length.
  Keys are [B, H, D, L] and values [B, H, L, D]: the layouts attention reads
  without a transpose or copy (`attention.dot_product_attention`).

  Attributes:
    keys: one [B, H, D, L] array of self-attention keys per decoder layer.
    values: one [B, H, L, D] array of self-attention values per layer.
    cross_keys: one [B, H, D, S] array per layer, projected once from the
      encoder's output.
    cross_values: one [B, H, S, D] array per layer.
    encoder_mask: bool [B, S], True at the real (non-padding) input tokens.
    lengths: int32 [B], the decoder tokens written for each row. Positions at
      or beyond a row's length are masked and free to be overwritten.
    key_buckets: static; how many key bounds the decode loops run this cache
      at (`T5Config.attention_buckets`; 1 reads the whole capacity).
  """

  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  cross_keys: tuple[jax.Array, ...]
  cross_values: tuple[jax.Array, ...]
  encoder_mask: jax.Array
  lengths: jax.Array
  key_buckets: int = struct.field(pytree_node=False, default=1)

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
        key_buckets=self.key_buckets,
    )


def write(keys_cache, values_cache, keys, values, positions):
  """Writes the new positions into one layer's cache.

  Args:
    keys_cache: [B, H, D, L].
    values_cache: [B, H, L, D].
    keys: [B, H, D, T], the call's new keys.
    values: [B, H, T, D].
    positions: int32 [B, T], where each row's new positions go.

  Returns:
    The updated (keys_cache, values_cache).
  """
  if keys_cache.shape[0] == 1:
    return _per_head(keys_cache, values_cache, keys, values, positions)
  return _per_position(keys_cache, values_cache, keys, values, positions)


def _per_position(keys_cache, values_cache, keys, values, positions):
  rows = jnp.arange(keys_cache.shape[0])[:, None]  # [B, 1]
  # Indexing rows and positions puts their [B, T] first: each update is the
  # [H, D] slab of one position, so [B, H, D, T] -> [B, T, H, D] and
  # [B, H, T, D] -> [B, T, H, D].
  keys_cache = keys_cache.at[rows, :, :, positions].set(
      jnp.transpose(keys, (0, 3, 1, 2)), mode="drop"
  )
  values_cache = values_cache.at[rows, :, positions].set(
      jnp.transpose(values, (0, 2, 1, 3)), mode="drop"
  )
  return keys_cache, values_cache


def _per_head(keys_cache, values_cache, keys, values, positions):
  rows = jnp.arange(keys_cache.shape[0])[:, None, None]  # [B, 1, 1]
  heads = jnp.arange(keys_cache.shape[1])[None, :, None]  # [1, H, 1]
  slots = positions[:, None, :]  # [B, 1, T]
  # Either write indexes [B, H, T] entries of D elements, so the keys go in
  # as [B, H, D, T] -> [B, H, T, D].
  keys_cache = keys_cache.at[rows, heads, :, slots].set(
      jnp.swapaxes(keys, 2, 3), mode="drop"
  )
  values_cache = values_cache.at[rows, heads, slots].set(values, mode="drop")
  return keys_cache, values_cache
