"""Baseline autoregressive decoding: one token per target call.

The loop follows t5x's `temperature_sample`: one jitted `lax.while_loop` with
fixed shapes, a per-row EOS, and a sampling key per step from
`jax.random.fold_in(decode_rng, cur_index)`. It knows nothing of Flax: the model
enters as a decode function (see `DecodeFn`), so tests drive it with fake
models.
"""

from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import checks
from spec_decode import key_buckets
from spec_decode import sampling

# T5 starts decoding from the pad token.
BOS_ID = 0


class DecodeFn(Protocol):
  """A model's incremental decoder, with its parameters bound in.

  Appends T tokens to each row of the cache at that row's own
  `cache.lengths[b]` (overwriting whatever is there) and returns the logits
  after each of them, with `lengths` advanced by T. Keys at positions at or
  past a row's length are masked, so `cache.replace(lengths=...)` rolls a row
  back. Pass it as a pytree whose leaves are arrays (`jax.tree_util.Partial`,
  or a `flax.struct.dataclass` with `__call__`) so that jitted loops trace its
  parameters instead of baking them in as constants.
  """

  def __call__(self, tokens: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
    """Returns logits [B, T, V] (logits[:, t] follows tokens[:, t]), cache."""


@flax.struct.dataclass
class DecodeResult:
  """What `autoregressive_decode` returns.

  Attributes:
    sequences: int32 [B, max_decode_len] emitted tokens, EOS included, padded
      with 0 after each row's length.
    lengths: int32 [B] tokens emitted per row.
    target_calls: int32 [B] target calls spent on each row (equal to lengths).
    nonfinite: bool [B] whether the target's logits for the row were ever
      NaN or infinite while it was live (its tokens are then garbage, though
      inside the vocabulary); None in results built by hand.
  """

  sequences: jax.Array
  lengths: jax.Array
  target_calls: jax.Array
  nonfinite: jax.Array | None = None


@flax.struct.dataclass
class DecodeLoopState:
  """The state of the baseline decoding loop.

  Attributes:
    cur_index: int32 [] steps taken: the position of the next token.
    sequences: int32 [B, max_decode_len] emitted tokens (garbage past EOS).
    last_tokens: int32 [B] the token to feed next (BOS at the start).
    done: bool [B] whether the row has emitted EOS or reached max_decode_len.
    lengths: int32 [B] tokens emitted per row.
    cache: the target's cache (a pytree with `lengths: int32 [B]`).
    nonfinite: bool [B] see `DecodeResult`.
  """

  cur_index: jax.Array
  sequences: jax.Array
  last_tokens: jax.Array
  done: jax.Array
  lengths: jax.Array
  cache: Any
  nonfinite: jax.Array


def check_decode_args(max_decode_len: int, eos_id: int) -> None:
  """Raises ValueError, in one line, on arguments no loop can run with."""
  if not checks.is_int(max_decode_len) or max_decode_len < 1:
    raise ValueError(
        f"max_decode_len must be an int >= 1, got {max_decode_len!r}."
    )
  if not checks.is_integer(eos_id):
    raise ValueError(f"eos_id must be an int, got {eos_id!r}.")


def check_capacity(cache: Any, needed: int, name: str, why: str) -> None:
  """Raises ValueError, in one line, on a cache with too little room.

  A write past a cache's capacity is dropped, so a call that writes there
  reads without its own keys: for a token that is emitted, a silent wrong
  one, not an error. Caches with no `max_length` are not checked: n-gram
  models', test fakes', and prompt lookup's, whose short history could
  only cost accepted drafts, never a wrong token (the target verifies).

  Args:
    cache: a decode cache.
    needed: the decoder positions the loop writes.
    name: the argument's name, for the message.
    why: what needs them, for the message.
  """
  capacity = getattr(cache, "max_length", None)
  if capacity is not None and capacity < needed:
    raise ValueError(
        f"{name} holds {capacity} decoder positions; {why} need {needed}."
    )


def as_pytree(decode_fn: DecodeFn) -> DecodeFn:
  """Makes `decode_fn` a valid jit argument, wrapping plain functions.

  A plain function (or `functools.partial`) becomes the static part of a
  `jax.tree_util.Partial`; arrays it closes over are then compiled in as
  constants.

  Args:
    decode_fn: A decode function.

  Returns:
    `decode_fn`, or a `jax.tree_util.Partial` of it, whose leaves are arrays.
  """
  leaves = jax.tree_util.tree_leaves(decode_fn)
  if all(isinstance(leaf, (jax.Array, np.ndarray)) for leaf in leaves):
    return decode_fn
  return jax.tree_util.Partial(decode_fn)


def autoregressive_decode(
    target_fn: DecodeFn,
    cache: Any,
    decode_rng: jax.Array,
    *,
    max_decode_len: int,
    eos_id: int = 1,
    config: sampling.SamplingConfig = sampling.SamplingConfig(),
    return_cache: bool = False,
) -> DecodeResult | tuple[DecodeResult, Any]:
  """Samples from the target one token per call, starting from BOS.

  Args:
    target_fn: The target's decode function.
    cache: The target's empty cache (lengths 0), with room for max_decode_len
      positions.
    decode_rng: A PRNG key; step i samples with fold_in(decode_rng, i).
    max_decode_len: Most tokens to emit per row.
    eos_id: A row stops after emitting this token (an id outside the
      vocabulary, such as -1, disables EOS).
    config: How logits become the sampling distribution.
    return_cache: also return the final cache (see
      `speculative.speculative_decode`).

  Returns:
    A `DecodeResult`, and with `return_cache` the cache.
  """
  check_decode_args(max_decode_len, eos_id)
  check_capacity(
      cache, max_decode_len, "cache", f"max_decode_len {max_decode_len} tokens"
  )
  return _autoregressive_decode(
      as_pytree(target_fn),
      cache,
      decode_rng,
      max_decode_len=max_decode_len,
      eos_id=eos_id,
      config=config,
      return_cache=return_cache,
  )


@jax.jit(static_argnames=("max_decode_len", "eos_id", "return_cache"))
def _autoregressive_decode(
    target_fn,
    cache,
    decode_rng,
    *,
    max_decode_len,
    eos_id,
    config,
    return_cache,
):
  """`autoregressive_decode` after argument checks."""
  batch_size = cache.lengths.shape[0]

  def cond_fn(state: DecodeLoopState) -> jax.Array:
    return jnp.any(~state.done)

  def body_fn(state: DecodeLoopState) -> DecodeLoopState:
    logits, cache = target_fn(state.last_tokens[:, None], state.cache)
    step_rng = jax.random.fold_in(decode_rng, state.cur_index)
    uniforms = sampling.draw_uniforms(step_rng, (batch_size,))
    tokens = sampling.choose(uniforms, logits[:, 0], config)[0]  # [B]
    sequences = jax.lax.dynamic_update_slice(
        state.sequences, tokens[:, None], (0, state.cur_index)
    )
    lengths = state.lengths + (~state.done).astype(jnp.int32)
    done = state.done | (tokens == eos_id) | (lengths >= max_decode_len)
    return DecodeLoopState(
        cur_index=state.cur_index + 1,
        sequences=sequences,
        last_tokens=tokens,
        done=done,
        lengths=lengths,
        cache=cache,
        nonfinite=state.nonfinite
        | (~state.done & sampling.nonfinite_rows(logits[:, 0])),
    )

  state = key_buckets.while_loop(
      cond_fn,
      body_fn,
      DecodeLoopState(
          cur_index=jnp.array(0, jnp.int32),
          sequences=jnp.zeros((batch_size, max_decode_len), jnp.int32),
          last_tokens=jnp.full((batch_size,), BOS_ID, jnp.int32),
          done=jnp.zeros((batch_size,), bool),
          lengths=jnp.zeros((batch_size,), jnp.int32),
          cache=cache,
          nonfinite=jnp.zeros((batch_size,), bool),
      ),
      cache_fields=("cache",),
      # A step's query sits at the row's length.
      num_keys_fn=lambda state: jnp.max(state.cache.lengths) + 1,
  )
  result = DecodeResult(
      sequences=mask_after_lengths(state.sequences, state.lengths),
      lengths=state.lengths,
      target_calls=state.lengths,
      nonfinite=state.nonfinite,
  )
  return (result, state.cache) if return_cache else result


def mask_after_lengths(sequences: jax.Array, lengths: jax.Array) -> jax.Array:
  """Zeroes sequences[b, i] for i >= lengths[b].

  Args:
    sequences: int32 [B, L] tokens.
    lengths: int32 [B] valid tokens per row.

  Returns:
    int32 [B, L].
  """
  positions = jnp.arange(sequences.shape[1])[None, :]  # [1, L]
  return jnp.where(positions < lengths[:, None], sequences, 0)
