"""Decode loops that read the cache up to a bucketed length, not its capacity.

A decode call's self-attention over the cache reads every position of its
capacity unless its shapes say otherwise: the rows' lengths are data, and
XLA's shapes are static. With `T5Config.attention_buckets` = n > 1, a loop
runs as n while loops in sequence, one per static key bound (the capacity's
1/n steps): each runs while the longest row's next call fits under its bound,
with `DecodeCache.key_limit` set to it, so its calls attend, and read, only
that prefix of the cache. The last bound is the capacity.

At batch 1 the loops do not bucket: there the cache is a small part of what a
call reads (T5 1.1 XXL, 264 positions: 0.15 of 11.3 GB), and a TPU compile of
the bounded 8-token call copies each layer's cache (README).

Each bound is a compiled loop body, so a decode compiles n bodies. Why not
one body that picks its bound in-graph (`lax.switch`): compiled for a TPU,
the conditional copies every layer's cache in and out of its branches (README,
"Step costs as compiled").
"""

import math

import jax

from spec_decode.models import decode_cache


def bounds(capacity, count):
  """The static key bounds of a cache: increasing, the last `capacity`.

  Args:
    capacity: the cache's positions.
    count: how many bounds; 1 reads the whole capacity at every call.

  Returns:
    The capacity's 1/count steps, each rounded up to a multiple of 8 (steps
    under 8 positions apart merge).
  """
  steps = (math.ceil(capacity * i / count) for i in range(1, count + 1))
  return tuple(sorted({min(capacity, -(-n // 8) * 8) for n in steps}))


def cache_bounds(cache):
  """The bounds the decode loops run a DecodeCache at."""
  if cache.lengths.shape[0] == 1:
    return (cache.max_length,)
  return bounds(cache.max_length, cache.key_buckets)


def bound_for(cache, num_keys):
  """The smallest of the cache's bounds that holds `num_keys` keys."""
  return next(
      (b for b in cache_bounds(cache) if b >= num_keys), cache.max_length
  )


def bounded(cache, limit):
  """`cache` with its calls reading its first `limit` positions (all of
  them, key_limit None, if `limit` reaches its capacity)."""
  return cache.replace(key_limit=limit if limit < cache.max_length else None)


def _with_limit(state, cache_fields, limit):
  """`state` with each DecodeCache in `cache_fields` bounded by `limit`."""
  replaced = {
      name: bounded(getattr(state, name), limit)
      for name in cache_fields
      if isinstance(getattr(state, name), decode_cache.DecodeCache)
  }
  return state.replace(**replaced)


def while_loop(cond_fn, body_fn, state, *, cache_fields, num_keys_fn):
  """`lax.while_loop(cond_fn, body_fn, state)`, run bound by bound.

  Args:
    cond_fn: the loop's condition.
    body_fn: its body; its decode calls read the caches' `key_limit`.
    state: the initial state, a flax struct dataclass.
    cache_fields: the names of the state's caches. The first, if a
      DecodeCache, sets the bounds (`cache_bounds`); else the loop is one.
    num_keys_fn: state -> int32 scalar, the most cache positions any call of
      the next iteration attends (its longest row's last query position + 1).

  Returns:
    The final state, its caches with no key limit.
  """
  first = getattr(state, cache_fields[0])
  if not isinstance(first, decode_cache.DecodeCache):
    return jax.lax.while_loop(cond_fn, body_fn, state)
  *limits, capacity = cache_bounds(first)
  for limit in limits:

    def bounded_cond_fn(state, limit=limit):
      return cond_fn(state) & (num_keys_fn(state) <= limit)

    state = jax.lax.while_loop(
        bounded_cond_fn, body_fn, _with_limit(state, cache_fields, limit)
    )
  return jax.lax.while_loop(
      cond_fn, body_fn, _with_limit(state, cache_fields, capacity)
  )
