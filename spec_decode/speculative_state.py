"""The speculative loop's state, and how one iteration advances it.

`speculative.py` runs the loop: draft, score, verify. This module holds what
the loop carries between iterations (`SpeculativeLoopState`), its value
before the first one, and step 4 of an iteration: which tokens each row
emits (`commit`), written into the history with the counts the results
report (`advance`).
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import decoding
from spec_decode import speculative_result as result_lib


@flax.struct.dataclass
class SpeculativeLoopState:
  """The state of the speculative decoding loop.

  Attributes:
    cur_index: int32 [] iterations run so far.
    history: int32 [B, max_decode_len + gamma + 2] BOS, then the emitted
      tokens (history[b, i] is token i, BOS being token 0); garbage after
      position lengths[b].
    sources: int32 [B, max_decode_len + gamma + 2] aligned with history:
      where each token came from (see `SpeculativeResult.token_sources`).
    rejected: int32 [B, max_decode_len + gamma + 2] aligned with history: the
      rejected drafted token at each result_lib.REPLACEMENT, -1 elsewhere.
    lengths: int32 [B] tokens emitted per row. The target cache holds the
      history before the last token: its lengths equal these.
    done: bool [B] whether the row has emitted EOS or reached max_decode_len.
    target_cache: the target's cache (a pytree with `lengths: int32 [B]`).
    draft_cache: the draft's cache, valid up to at least lengths - 1.
    target_calls: int32 [B] see `SpeculativeResult`.
    drafted_tokens: int32 [B] see `SpeculativeResult`.
    accepted_tokens: int32 [B] see `SpeculativeResult`.
    beta_sum: float32 [B] see `SpeculativeResult`.
    draft_calls: int32 [B] see `SpeculativeResult`.
    nonfinite: bool [B] see `SpeculativeResult`.
  """

  cur_index: jax.Array
  history: jax.Array
  sources: jax.Array
  rejected: jax.Array
  lengths: jax.Array
  done: jax.Array
  target_cache: Any
  draft_cache: Any
  target_calls: jax.Array
  drafted_tokens: jax.Array
  accepted_tokens: jax.Array
  beta_sum: jax.Array
  draft_calls: jax.Array
  nonfinite: jax.Array


def _write_rows(whole, part, starts):
  """whole[b, starts[b]:starts[b] + T] = part[b] for each row b."""
  return jax.vmap(
      lambda row, values, start: jax.lax.dynamic_update_slice(
          row, values, (start,)
      )
  )(whole, part, starts)


def commit(
    draft_tokens,
    num_accepted,
    next_tokens,
    num_drafted,
    lengths,
    done,
    *,
    eos_id,
    max_decode_len,
):
  """Step 4: the block x_1..x_n, next token, and how much of it each row emits.

  Args:
    draft_tokens: int32 [B, gamma] the drafted tokens.
    num_accepted: int32 [B] n, the drafts accepted.
    next_tokens: int32 [B] the replacement or bonus token.
    num_drafted: int32 [B] the drafts proposed (gamma without early stop).
    lengths: int32 [B] tokens emitted before this iteration.
    done: bool [B] rows that had finished before this iteration.
    eos_id: the token that ends a row.
    max_decode_len: most tokens a row emits.

  Returns:
    block: int32 [B, gamma + 1] x_1..x_n, then the next token (junk after).
    sources: int32 [B, gamma + 1] result_lib.ACCEPTED, then result_lib.REPLACEMENT or result_lib.BONUS.
    rejected: int32 [B, gamma + 1] the rejected draft at a result_lib.REPLACEMENT, else
      -1.
    num_emitted: int32 [B] tokens of the block the row emits: up to its
      first EOS and max_decode_len, 0 for rows already done.
    hit_eos: bool [B] whether the emitted tokens hold EOS.
  """
  gamma = draft_tokens.shape[1]
  block_positions = jnp.arange(gamma + 1)[None, :]  # [1, gamma + 1]
  padded_drafts = jnp.pad(draft_tokens, ((0, 0), (0, 1)))  # [B, gamma + 1]
  block = jnp.where(
      block_positions < num_accepted[:, None],
      padded_drafts,
      next_tokens[:, None],
  )  # [B, gamma + 1]
  num_emitted = jnp.minimum(num_accepted + 1, max_decode_len - lengths)
  is_eos = (block == eos_id) & (block_positions < num_emitted[:, None])
  hit_eos = jnp.any(is_eos, axis=1)
  num_emitted = jnp.where(hit_eos, jnp.argmax(is_eos, axis=1) + 1, num_emitted)
  num_emitted = jnp.where(done, 0, num_emitted)
  is_next = block_positions == num_accepted[:, None]  # [B, gamma + 1]
  replaced = num_accepted < num_drafted  # [B]
  sources = jnp.where(
      is_next,
      jnp.where(replaced, result_lib.REPLACEMENT, result_lib.BONUS)[:, None],
      result_lib.ACCEPTED,
  )  # [B, gamma + 1]
  rejected = jnp.where(is_next & replaced[:, None], padded_drafts, -1)
  return block, sources, rejected, num_emitted, hit_eos


def advance(
    state,
    draft_tokens,
    committed,
    *,
    num_accepted,
    num_drafted,
    beta,
    draft_steps,
    target_cache,
    draft_cache,
    nonfinite,
    max_decode_len,
):
  """The loop state after one iteration: the block written, the counts kept.

  Args:
    state: the SpeculativeLoopState before the iteration.
    draft_tokens: int32 [B, gamma] the drafted tokens.
    committed: `commit`'s (block, sources, rejected, num_emitted, hit_eos).
    num_accepted: int32 [B] the drafts accepted.
    num_drafted: int32 [B] the drafts proposed.
    beta: float32 [B, gamma] sum_x min(target_probs, draft_probs) per draft.
    draft_steps: int32 [] draft calls the iteration made.
    target_cache: the target's cache after its call.
    draft_cache: the draft's cache after its calls.
    nonfinite: bool [B, gamma + 1] positions whose target logits were NaN or
      infinite.
    max_decode_len: most tokens a row emits.

  Returns:
    The next SpeculativeLoopState.
  """
  block, sources, rejected, num_emitted, hit_eos = committed
  gamma = draft_tokens.shape[1]
  new_lengths = state.lengths + num_emitted
  history, sources, rejected = (
      _write_rows(whole, part, state.lengths + 1)
      for whole, part in (
          (state.history, block),
          (state.sources, sources),
          (state.rejected, rejected),
      )
  )
  # Statistics over the drafts judged, up to EOS and max_decode_len.
  num_judged = jnp.minimum(
      jnp.minimum(num_accepted + 1, num_drafted), num_emitted
  )
  judged = jnp.arange(gamma)[None, :] < num_judged[:, None]  # [B, gamma]
  num_kept = jnp.minimum(num_accepted, num_emitted)  # Accepted and emitted.
  live = (~state.done).astype(jnp.int32)
  return SpeculativeLoopState(
      cur_index=state.cur_index + 1,
      history=history,
      sources=sources,
      rejected=rejected,
      lengths=new_lengths,
      done=state.done | hit_eos | (new_lengths >= max_decode_len),
      target_cache=target_cache.replace(lengths=new_lengths),
      draft_cache=draft_cache,
      target_calls=state.target_calls + live,
      drafted_tokens=state.drafted_tokens + num_judged,
      accepted_tokens=state.accepted_tokens + num_kept,
      beta_sum=state.beta_sum + jnp.sum(jnp.where(judged, beta, 0.0), axis=1),
      draft_calls=state.draft_calls + live * draft_steps,
      nonfinite=state.nonfinite | (~state.done & jnp.any(nonfinite, 1)),
  )


def initial_state(target_cache, draft_cache, *, history_len):
  """The loop's state before the first iteration: no token emitted."""
  batch_size = target_cache.lengths.shape[0]
  zeros = jnp.zeros((batch_size,), jnp.int32)
  history_shape = (batch_size, history_len)
  return SpeculativeLoopState(
      cur_index=jnp.array(0, jnp.int32),
      history=jnp.full(history_shape, decoding.BOS_ID, jnp.int32),
      sources=jnp.full(history_shape, result_lib.PADDING, jnp.int32),
      rejected=jnp.full(history_shape, -1, jnp.int32),
      lengths=zeros,
      done=jnp.zeros((batch_size,), bool),
      target_cache=target_cache,
      draft_cache=draft_cache,
      target_calls=zeros,
      drafted_tokens=zeros,
      accepted_tokens=zeros,
      beta_sum=jnp.zeros((batch_size,), jnp.float32),
      draft_calls=zeros,
      nonfinite=jnp.zeros((batch_size,), bool),
  )
