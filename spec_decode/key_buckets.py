"""Decode loops that read the cache up to a bucketed length, not its capacity.

A decode call's self-attention over the cache reads every position of its
capacity unless its shapes say otherwise: the rows' lengths are data, and
XLA's shapes are static. With `T5Config.attention_buckets` = n > 1, a loop
runs as n while loops in sequence, one per static key bound (the capacity's
1/n steps): each runs while the longest row's next call fits under its bound,
and carries each cache cut to that bound, so its calls attend, read and write
only that prefix. Between two loops each cache is padded to the next bound
(one copy of it per bound); the last bound is the capacity.

Why carry the cut cache rather than slice the whole one at every call: a TPU
compile of T5 1.1 XXL's 8-token call at batch 32 then sliced each layer's
keys and values to the bound as separate instructions, 3.4 GB of the 24.5 GB
it moved, since the compiler fuses no slice into the attention's
convolution; at batch 1 it copied each layer's cache; and XLA:CPU copied
each prefix before reading it (README, "What HBM must move").

Each bound is a compiled loop body, so a decode compiles n bodies. Why not
one body that picks its bound in-graph (`lax.switch`): compiled for a TPU,
the conditional copies every layer's cache in and out of its branches (README,
"Step costs as compiled").
"""

import math

import jax
import jax.numpy as jnp

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
  return bounds(cache.max_length, cache.key_buckets)


def bound_for(cache, num_keys):
  """The smallest of the cache's bounds that holds `num_keys` keys."""
  return next(
      (b for b in cache_bounds(cache) if b >= num_keys), cache.max_length
  )


def _resized_positions(x, axis, length):
  """`x` cut to its first `length` entries along `axis`, or zero-padded."""
  if length == x.shape[axis]:
    return x
  if length < x.shape[axis]:
    return jax.lax.slice_in_dim(x, 0, length, axis=axis)
  padding = [(0, 0)] * x.ndim
  padding[axis] = (0, length - x.shape[axis])
  return jnp.pad(x, padding)


def resized(cache, length):
  """`cache` with room for `length` decoder positions.

  Its self-attention keys and values are cut to their first `length`
  positions, or padded with zeros (masked, free positions) to `length`. A
  call on the result attends, reads and writes those positions alone, so
  every row's length plus the call's tokens must be within `length` (the
  loops guarantee it; a write past it is dropped).
  """
  return cache.replace(
      keys=tuple(_resized_positions(k, 3, length) for k in cache.keys),
      values=tuple(_resized_positions(v, 2, length) for v in cache.values),
  )


def _with_limit(state, capacities, limit):
  """`state` with each cache named in `capacities` resized to `limit`, or to
  its capacity if that is less."""
  replaced = {
      name: resized(getattr(state, name), min(limit, capacity))
      for name, capacity in capacities.items()
  }
  return state.replace(**replaced)


def while_loop(cond_fn, body_fn, state, *, cache_fields, num_keys_fn):
  """`lax.while_loop(cond_fn, body_fn, state)`, run bound by bound.

  Args:
    cond_fn: the loop's condition.
    body_fn: its body; its decode calls read and write the caches it is
      given, whatever their length.
    state: the initial state, a flax struct dataclass.
    cache_fields: the names of the state's caches. The first, if a
      DecodeCache, sets the bounds (`cache_bounds`); else the loop is one.
    num_keys_fn: state -> int32 scalar, the most cache positions any call of
      the next iteration attends (its longest row's last query position + 1).

  Returns:
    The final state, its caches at their capacity.
  """
  first = getattr(state, cache_fields[0])
  if not isinstance(first, decode_cache.DecodeCache):
    return jax.lax.while_loop(cond_fn, body_fn, state)
  capacities = {
      name: getattr(state, name).max_length
      for name in cache_fields
      if isinstance(getattr(state, name), decode_cache.DecodeCache)
  }
  *limits, capacity = cache_bounds(first)
  for limit in limits:

    def bounded_cond_fn(state, limit=limit):
      return cond_fn(state) & (num_keys_fn(state) <= limit)

    state = jax.lax.while_loop(
        bounded_cond_fn, body_fn, _with_limit(state, capacities, limit)
    )
  return jax.lax.while_loop(
      cond_fn, body_fn, _with_limit(state, capacities, capacity)
  )
