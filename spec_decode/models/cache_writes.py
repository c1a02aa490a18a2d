"""Writing a decode call's new keys and values into the cache.

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
"""

import jax.numpy as jnp


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
