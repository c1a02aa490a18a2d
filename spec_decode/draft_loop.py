"""Step 1 of a speculative iteration: the draft proposes its tokens.

Up to gamma draft calls, inside the decoding loop's jitted body: unrolled,
or with a confidence threshold a `lax.while_loop` that can stop early. With a
confidence threshold (adaptive draft length, as Hugging Face's
`assistant_confidence_threshold`), each row stops proposing after its first
draft whose confidence is below the threshold, and the draft stops calling
once every live row has. The decision is a function of the row's own drafts,
so a verifier that judges only the proposed prefix stays exact.
"""

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import checks
from spec_decode import sampling


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Threshold:
  """The draft's confidence threshold, as a compiled loop takes it.

  A pytree whose leaf is the value and whose structure is whether it stops
  early at all (value > 0), which decides the draft loop's shape: unrolled
  calls without, a `lax.while_loop` with. So one compiled loop serves every
  threshold above 0, as `sampling.SamplingConfig` serves every temperature.

  Attributes:
    value: in [0, 1); 0 always drafts gamma tokens.
    early_stop: value > 0 (set from it).
  """

  value: float = 0.0

  def __post_init__(self):
    if not (checks.is_number(self.value) and 0 <= self.value < 1):
      raise ValueError(
          f"draft_threshold must be in [0, 1), got {self.value!r}."
      )
    object.__setattr__(self, "value", float(self.value))
    object.__setattr__(self, "early_stop", self.value > 0)

  def tree_flatten(self):
    return (self.value,), self.early_stop

  @classmethod
  def tree_unflatten(cls, early_stop, leaves):
    threshold = object.__new__(cls)
    object.__setattr__(threshold, "value", leaves[0])
    object.__setattr__(threshold, "early_stop", early_stop)
    return threshold


def _confidence(logits, tokens, probs):
  """float32 [B]: probs(tokens), or the max softmax probability if greedy."""
  if probs is None:
    logits = logits.astype(jnp.float32)
    shifted = logits - jnp.max(logits, axis=-1, keepdims=True)  # [B, V]
    return 1.0 / jnp.sum(jnp.exp(shifted), axis=-1)
  return jnp.take_along_axis(probs, tokens[:, None], axis=-1)[:, 0]


@flax.struct.dataclass
class _DraftState:
  """The state of the draft loop of one iteration.

  Attributes:
    step: int32 [] drafts made so far (the next one's index).
    cache: the draft's cache.
    tokens: int32 [B, gamma] the drafts (0 past `step`).
    probs: float32 [B, gamma, V] their distributions, or None when greedy.
    num_drafted: int32 [B] drafts each row proposes: those up to and
      including its first one below the threshold.
    stopped: bool [B] rows done drafting (and rows done decoding).
  """

  step: jax.Array
  cache: Any
  tokens: jax.Array
  probs: jax.Array | None
  num_drafted: jax.Array
  stopped: jax.Array


def _first_logits(draft_fn, draft_cache, history, lengths):
  """The first draft's logits [B, V] and the cache, from one 2-token call.

  The call reads each row's last two tokens: after an iteration that accepted
  every draft, the draft has read neither its last draft nor the target's
  bonus token.
  """
  start = jnp.maximum(lengths - 1, 0)  # [B]
  chunk = jnp.take_along_axis(
      history, start[:, None] + jnp.arange(2)[None, :], axis=1
  )  # [B, 2]
  logits, draft_cache = draft_fn(chunk, draft_cache.replace(lengths=start))
  # At len = 0 the chunk is [BOS, junk]: keep the logits after BOS, and the
  # length, which drops the junk.
  offset = (lengths - start)[:, None, None]  # [B, 1, 1]
  logits = jnp.take_along_axis(logits, offset, axis=1)[:, 0]  # [B, V]
  return logits, draft_cache.replace(lengths=lengths + 1)


def _add(state, logits, *, uniforms, config, threshold):
  """Draws draft number state.step from logits [B, V].

  Args:
    state: the _DraftState.
    logits: [B, V] the draft's logits for it.
    uniforms: float32 [B, gamma, 2] every draft's randomness.
    config: the sampling.SamplingConfig.
    threshold: the confidence Threshold.

  Returns:
    The _DraftState with the draft added.
  """
  tokens, probs = sampling.choose(
      jax.lax.dynamic_index_in_dim(
          uniforms, state.step, axis=1, keepdims=False
      ),
      logits,
      config,
  )
  stopped = state.stopped
  if threshold.early_stop:
    stopped |= _confidence(logits, tokens, probs) < threshold.value
  put = lambda whole, part: jax.lax.dynamic_update_index_in_dim(
      whole, part, state.step, axis=1
  )
  return state.replace(
      step=state.step + 1,
      tokens=put(state.tokens, tokens),
      probs=None if probs is None else put(state.probs, probs),
      num_drafted=jnp.where(state.stopped, state.num_drafted, state.step + 1),
      stopped=stopped,
  )


def propose(
    draft_fn,
    draft_cache,
    history,
    lengths,
    done,
    draft_rng,
    *,
    gamma,
    config,
    threshold,
):
  """Step 1: the drafts, their distributions and counts, and the cache.

  Returns:
    draft_tokens: int32 [B, gamma].
    draft_probs: float32 [B, gamma, V], or None when greedy (see
      `sampling.choose`).
    num_drafted: int32 [B] drafts proposed per row (gamma without threshold).
    steps: int32 [] draft calls made.
    draft_cache: the cache.
  """
  logits, draft_cache = _first_logits(draft_fn, draft_cache, history, lengths)
  batch_size, vocab_size = logits.shape
  add = functools.partial(
      _add,
      # Every draft's randomness in one PRNG call: [B, gamma, 2].
      uniforms=sampling.draw_uniforms(draft_rng, (batch_size, gamma)),
      config=config,
      threshold=threshold,
  )
  state = add(
      _DraftState(
          step=jnp.array(0, jnp.int32),
          cache=draft_cache,
          tokens=jnp.zeros((batch_size, gamma), jnp.int32),
          probs=None
          if config.greedy
          else jnp.zeros((batch_size, gamma, vocab_size), jnp.float32),
          num_drafted=jnp.zeros((batch_size,), jnp.int32),
          stopped=done,
      ),
      logits,
  )

  def cond_fn(state):
    return (state.step < gamma) & jnp.any(~state.stopped)

  def body_fn(state):
    last = jax.lax.dynamic_index_in_dim(
        state.tokens, state.step - 1, axis=1
    )  # [B, 1]
    logits, cache = draft_fn(last, state.cache)
    return add(state.replace(cache=cache), logits[:, 0])

  if threshold.early_stop:
    state = jax.lax.while_loop(cond_fn, body_fn, state)
  else:
    # Every row drafts gamma tokens (the iteration runs only while a row is
    # live), so the calls are unrolled: no loop on the device, static indices.
    for _ in range(gamma - 1):
      state = body_fn(state)
  return state.tokens, state.probs, state.num_drafted, state.step, state.cache
