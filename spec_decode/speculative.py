"""Speculative decoding: Algorithm 1 of Leviathan, Kalman & Matias (ICML 2023).

Each iteration, for every row at once, the draft proposes gamma tokens, the
target scores all of them in one call, and a vectorized accept/reject step
keeps a prefix of the proposals and adds one token of its own. The output has
exactly the distribution of sampling from the target alone (Theorem 3.5 of the
paper), for any draft, and every row advances by its own count.

The whole decode is one jitted `lax.while_loop` with fixed shapes: nothing goes
back to the host until every row is done.

References:
  Y. Leviathan, M. Kalman, Y. Matias. Fast Inference from Transformers via
  Speculative Decoding. ICML 2023. arXiv:2211.17192.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import decoding
from spec_decode import sampling

# fold_in tags that split an iteration's key into independent streams.
_DRAFT_STREAM = 0
_COIN_STREAM = 1
_RESIDUAL_STREAM = 2

# Where each emitted token came from (`SpeculativeResult.token_sources`).
PADDING = 0
ACCEPTED = 1  # A drafted token the target accepted.
REPLACEMENT = 2  # Drawn from the residual after the draft's first rejection.
BONUS = 3  # Drawn from the target after the draft's block was all accepted.


@flax.struct.dataclass
class SpeculativeResult:
  """What `speculative_decode` returns, with its statistics per row.

  A drafted token counts as judged when the target ruled on it: the accepted
  ones plus the first rejected one of each block, up to and including EOS and
  within max_decode_len.

  Attributes:
    sequences: int32 [B, max_decode_len] emitted tokens, EOS included, padded
      with 0 after each row's length.
    lengths: int32 [B] tokens emitted per row.
    target_calls: int32 [B] target calls spent on the row while it was live.
    drafted_tokens: int32 [B] drafted tokens judged.
    accepted_tokens: int32 [B] drafted tokens accepted.
    beta_sum: float32 [B] sum, over the positions of the judged drafted tokens,
      of beta = sum_x min(target_probs(x), draft_probs(x)).
    token_sources: int32 [B, max_decode_len] where each emitted token came
      from: ACCEPTED, REPLACEMENT or BONUS (PADDING after the row's length).
      Each target call emits a run of ACCEPTED tokens closed by one
      REPLACEMENT or BONUS token (unless EOS or max_decode_len cuts it).
    rejected_tokens: int32 [B, max_decode_len] at each REPLACEMENT token, the
      drafted token the target rejected there; -1 elsewhere.
    nonfinite: bool [B] whether the target's logits for the row were ever
      NaN or infinite while it was live (see `decoding.DecodeResult`); None
      in results built by hand. The draft's are not counted: a NaN draft
      distribution is only ever rejected.
  """

  sequences: jax.Array
  lengths: jax.Array
  target_calls: jax.Array
  drafted_tokens: jax.Array
  accepted_tokens: jax.Array
  beta_sum: jax.Array
  token_sources: jax.Array
  rejected_tokens: jax.Array
  nonfinite: jax.Array | None = None

  def acceptance_rate(self) -> jax.Array:
    """Empirical alpha: accepted / judged drafted tokens, over all rows."""
    return jnp.sum(self.accepted_tokens) / jnp.sum(self.drafted_tokens)

  def alpha_estimate(self) -> jax.Array:
    """The paper's alpha = E[beta] (Corollary 3.6), over positions judged."""
    return jnp.sum(self.beta_sum) / jnp.sum(self.drafted_tokens)

  def tokens_per_target_call(self) -> jax.Array:
    """Emitted tokens / target calls, over all rows (Eq. 1 predicts it)."""
    return jnp.sum(self.lengths) / jnp.sum(self.target_calls)


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
      rejected drafted token at each REPLACEMENT, -1 elsewhere.
    lengths: int32 [B] tokens emitted per row. The target cache holds the
      history before the last token: its lengths equal these.
    done: bool [B] whether the row has emitted EOS or reached max_decode_len.
    target_cache: the target's cache (a pytree with `lengths: int32 [B]`).
    draft_cache: the draft's cache, valid up to at least lengths - 1.
    target_calls: int32 [B] see `SpeculativeResult`.
    drafted_tokens: int32 [B] see `SpeculativeResult`.
    accepted_tokens: int32 [B] see `SpeculativeResult`.
    beta_sum: float32 [B] see `SpeculativeResult`.
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
  nonfinite: jax.Array


def accepted_count(
    coins: jax.Array,
    target_token_probs: jax.Array,
    draft_token_probs: jax.Array,
) -> jax.Array:
  """Counts the leading accepted drafted tokens of each row.

  Token i is accepted when coins_i < target_probs_i(x_i) / draft_probs_i(x_i),
  written without the division so that no case needs care.

  Args:
    coins: float32 [B, gamma] uniform draws in [0, 1).
    target_token_probs: float32 [B, gamma] target_probs_i(x_i).
    draft_token_probs: float32 [B, gamma] draft_probs_i(x_i).

  Returns:
    int32 [B] number of leading accepted tokens, in 0..gamma.
  """
  accepted = coins * draft_token_probs < target_token_probs  # [B, gamma]
  return jnp.sum(jnp.cumprod(accepted, axis=-1), axis=-1).astype(jnp.int32)


def residual_probs(
    target_probs: jax.Array, draft_probs: jax.Array
) -> jax.Array:
  """The distribution to sample from after a rejection, unnormalized.

  max(0, target_probs - draft_probs), or target_probs where that is all zero
  (target_probs == draft_probs, where a rejection has probability 0 but
  rounding could still force one; the naive normalization would give NaN).

  Args:
    target_probs: float32 [..., V].
    draft_probs: float32 [..., V].

  Returns:
    float32 [..., V] non-negative weights with a positive sum, for `sample`.
  """
  residual = jnp.maximum(target_probs - draft_probs, 0.0)
  has_mass = jnp.sum(residual, axis=-1, keepdims=True) > 0
  return jnp.where(has_mass, residual, target_probs)


def verify(
    coin_rng: jax.Array,
    residual_rng: jax.Array,
    target_probs: jax.Array,
    draft_probs: jax.Array,
    draft_tokens: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The accept/reject step: how many drafts to keep, and the next token.

  Args:
    coin_rng: Key for the acceptance coins.
    residual_rng: Key for the next token.
    target_probs: float32 [B, gamma + 1, V] the target's distributions after
      the last committed token and after each drafted token.
    draft_probs: float32 [B, gamma, V] the distributions the drafts came from.
    draft_tokens: int32 [B, gamma] the drafted tokens.

  Returns:
    num_accepted: int32 [B] in 0..gamma, accepted drafts per row.
    next_tokens: int32 [B] drawn from the residual at position num_accepted,
      or from target_probs[:, gamma] (the bonus token) after a full accept.
    beta: float32 [B, gamma] sum_x min(target_probs_i(x), draft_probs_i(x)).
  """
  tokens = draft_tokens[..., None]  # [B, gamma, 1]
  target_token_probs = jnp.take_along_axis(target_probs[:, :-1], tokens, -1)
  draft_token_probs = jnp.take_along_axis(draft_probs, tokens, -1)
  coins = jax.random.uniform(coin_rng, draft_tokens.shape, jnp.float32)
  num_accepted = accepted_count(
      coins, target_token_probs[..., 0], draft_token_probs[..., 0]
  )
  # The draft's distribution past the last draft is 0, so that the residual
  # there is the target's own: the bonus token needs no branch.
  padded_draft_probs = jnp.pad(
      draft_probs, ((0, 0), (0, 1), (0, 0))
  )  # [B, gamma + 1, V]
  position = num_accepted[:, None, None]  # [B, 1, 1]
  next_probs = residual_probs(
      jnp.take_along_axis(target_probs, position, axis=1)[:, 0],
      jnp.take_along_axis(padded_draft_probs, position, axis=1)[:, 0],
  )  # [B, V]
  beta = jnp.sum(jnp.minimum(target_probs[:, :-1], draft_probs), axis=-1)
  return num_accepted, sampling.sample(residual_rng, next_probs), beta


def verify_greedy(
    target_logits: jax.Array, draft_tokens: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`verify` at temperature 0, from the target's logits alone.

  With one-hot target_probs and draft_probs the general rule reduces to
  comparisons: x_i is accepted (with any coin) exactly when it is the target's
  argmax, the residual after a rejection is the target's one-hot, and so is
  the bonus token's distribution. So this returns what `verify` would, with
  no pass over the vocabulary beyond one argmax per position.

  Args:
    target_logits: float [B, gamma + 1, V] the target's logits.
    draft_tokens: int32 [B, gamma] the drafted (greedy) tokens.

  Returns:
    num_accepted, next_tokens, beta: as `verify` returns them; beta is 1
    where the draft's argmax matched the target's and 0 elsewhere.
  """
  target_tokens = sampling.greedy_tokens(target_logits)  # [B, gamma + 1]
  matches = draft_tokens == target_tokens[:, :-1]  # [B, gamma]
  num_accepted = jnp.sum(jnp.cumprod(matches, axis=-1), axis=-1)
  next_tokens = jnp.take_along_axis(
      target_tokens, num_accepted[:, None], axis=1
  )[:, 0]
  return (
      num_accepted.astype(jnp.int32),
      next_tokens,
      matches.astype(jnp.float32),
  )


def speculative_decode(
    target_fn: decoding.DecodeFn,
    draft_fn: decoding.DecodeFn,
    target_cache: Any,
    draft_cache: Any,
    decode_rng: jax.Array,
    *,
    gamma: int,
    max_decode_len: int,
    eos_id: int = 1,
    config: sampling.SamplingConfig = sampling.SamplingConfig(),
    return_caches: bool = False,
) -> SpeculativeResult | tuple[SpeculativeResult, Any, Any]:
  """Samples from the target, gamma drafted tokens per target call.

  One iteration, for every row b at once, with len = lengths[b]:

  1. Draft: feed the 2-token chunk [history[len - 1], history[len]] at
     position len - 1 (at len = 0, BOS alone), then gamma - 1 single drafted
     tokens, sampling x_i ~ draft_probs_i.
  2. Target: one call on [history[len], x_1..x_gamma] at position len gives
     target_probs_1..target_probs_{gamma+1}.
  3. Verify: n leading accepted drafts, then the next token from the residual
     at n + 1 (the bonus token from target_probs_{gamma+1} when n = gamma).
  4. Commit x_1..x_n and the next token, cut after EOS and at
     max_decode_len; roll the target cache back to the new length.

  The draft cache needs no catch-up step of its own: its first call of each
  iteration re-writes position len - 1 and writes len, so it sees x_gamma
  after a full accept and always the token the target added. Re-writing an
  entry with the same prefix is harmless under the overwrite semantics of the
  cache. This way the draft runs gamma calls per iteration (gpt-fast runs an
  extra one) and no target step is spent before the loop: with the target as
  its own draft, n tokens take exactly ceil(n / (gamma + 1)) target calls.

  Worked example (the verify step; pinned by a test). gamma = 2, V = 4, a row
  drafts x = [2, 1] with
    draft_probs  = [[.1, .2, .5, .2], [.1, .4, .3, .2]]
    target_probs = [[.1, .1, .6, .2], [.3, .1, .3, .3], ...]
  and draws coins [.9, .5]. x_1 = 2: .9 * .5 = .45 < .6, accepted. x_2 = 1:
  .5 * .4 = .2 >= .1, rejected. So n = 1, and the next token is drawn from
  max(0, [.3, .1, .3, .3] - [.1, .4, .3, .2]) = [.2, 0, 0, .1], normalized
  [2/3, 0, 0, 1/3]: the row emits [2, 0] or [2, 3] and advances by 2.

  Args:
    target_fn: The target's decode function (see `decoding.DecodeFn`).
    draft_fn: The draft's decode function; may be `target_fn` itself.
    target_cache: The target's empty cache (lengths 0), with room for
      max_decode_len + gamma + 1 positions.
    draft_cache: The draft's empty cache, with the same room; may be
      `target_cache` itself.
    decode_rng: A PRNG key. Iteration i uses fold_in(decode_rng, i), split by
      fold_in into independent streams for drafts, coins and residuals.
    gamma: Tokens drafted per iteration, >= 1.
    max_decode_len: Most tokens to emit per row.
    eos_id: A row stops after emitting this token (an id outside the
      vocabulary, such as -1, disables EOS).
    config: How logits become the sampling distribution, for target and draft
      alike.
    return_caches: also return the final target and draft caches, so that a
      caller that donates the caches gets them back in the same memory.

  Returns:
    A `SpeculativeResult`, and with `return_caches` the two caches.
  """
  if not isinstance(gamma, int) or gamma < 1:
    raise ValueError(f"gamma must be an int >= 1, got {gamma!r}.")
  decoding.check_decode_args(max_decode_len, eos_id)
  return _speculative_decode(
      decoding.as_pytree(target_fn),
      decoding.as_pytree(draft_fn),
      target_cache,
      draft_cache,
      decode_rng,
      gamma=gamma,
      max_decode_len=max_decode_len,
      eos_id=eos_id,
      config=config,
      return_caches=return_caches,
  )


def _write_rows(whole, part, starts):
  """whole[b, starts[b]:starts[b] + T] = part[b] for each row b."""
  return jax.vmap(
      lambda row, values, start: jax.lax.dynamic_update_slice(
          row, values, (start,)
      )
  )(whole, part, starts)


def _draft(
    draft_fn, draft_cache, history, lengths, draft_rng, *, gamma, config
):
  """Step 1: draft_tokens [B, gamma], draft_probs [B, gamma, V], the cache.

  draft_probs is None when greedy (see `sampling.choose`).
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
  draft_cache = draft_cache.replace(lengths=lengths + 1)
  first = sampling.choose(jax.random.fold_in(draft_rng, 0), logits, config)

  def step(carry, i):
    draft_cache, token = carry
    logits, draft_cache = draft_fn(token[:, None], draft_cache)
    token, probs = sampling.choose(
        jax.random.fold_in(draft_rng, i), logits[:, 0], config
    )
    return (draft_cache, token), (token, probs)

  (draft_cache, _), rest = jax.lax.scan(
      step, (draft_cache, first[0]), jnp.arange(1, gamma)
  )  # tokens: [gamma - 1, B], probs: [gamma - 1, B, V] or None
  draft_tokens, draft_probs = jax.tree.map(
      lambda head, tail: jnp.concatenate(
          [head[:, None], jnp.moveaxis(tail, 0, 1)], axis=1
      ),
      first,
      rest,
  )  # [B, gamma], [B, gamma, V] or None
  return draft_tokens, draft_probs, draft_cache


@jax.jit(
    static_argnames=(
        "gamma",
        "max_decode_len",
        "eos_id",
        "config",
        "return_caches",
    )
)
def _speculative_decode(
    target_fn,
    draft_fn,
    target_cache,
    draft_cache,
    decode_rng,
    *,
    gamma,
    max_decode_len,
    eos_id,
    config,
    return_caches,
):
  """`speculative_decode` after argument checks."""
  batch_size = target_cache.lengths.shape[0]
  block_positions = jnp.arange(gamma + 1)[None, :]  # [1, gamma + 1]

  def cond_fn(state: SpeculativeLoopState) -> jax.Array:
    return jnp.any(~state.done)

  def body_fn(state: SpeculativeLoopState) -> SpeculativeLoopState:
    lengths = state.lengths
    iteration_rng = jax.random.fold_in(decode_rng, state.cur_index)
    draft_tokens, draft_probs, draft_cache = _draft(
        draft_fn,
        state.draft_cache,
        state.history,
        lengths,
        jax.random.fold_in(iteration_rng, _DRAFT_STREAM),
        gamma=gamma,
        config=config,
    )
    last_tokens = jnp.take_along_axis(state.history, lengths[:, None], axis=1)
    target_logits, target_cache = target_fn(
        jnp.concatenate([last_tokens, draft_tokens], axis=1),  # [B, gamma + 1]
        state.target_cache,
    )
    if config.greedy:
      num_accepted, next_tokens, beta = verify_greedy(
          target_logits, draft_tokens
      )
    else:
      num_accepted, next_tokens, beta = verify(
          jax.random.fold_in(iteration_rng, _COIN_STREAM),
          jax.random.fold_in(iteration_rng, _RESIDUAL_STREAM),
          sampling.logits_to_probs(target_logits, config),
          draft_probs,
          draft_tokens,
      )

    # Step 4: x_1..x_n, then the next token (positions past n are junk).
    block = jnp.where(
        block_positions < num_accepted[:, None],
        jnp.pad(draft_tokens, ((0, 0), (0, 1))),
        next_tokens[:, None],
    )  # [B, gamma + 1]
    num_emitted = jnp.minimum(num_accepted + 1, max_decode_len - lengths)
    is_eos = (block == eos_id) & (block_positions < num_emitted[:, None])
    hit_eos = jnp.any(is_eos, axis=1)
    num_emitted = jnp.where(
        hit_eos, jnp.argmax(is_eos, axis=1) + 1, num_emitted
    )
    num_emitted = jnp.where(state.done, 0, num_emitted)
    new_lengths = lengths + num_emitted
    is_next = block_positions == num_accepted[:, None]  # [B, gamma + 1]
    sources = jnp.where(
        is_next,
        jnp.where(num_accepted < gamma, REPLACEMENT, BONUS)[:, None],
        ACCEPTED,
    )  # [B, gamma + 1]
    rejected = jnp.where(
        is_next, jnp.pad(draft_tokens, ((0, 0), (0, 1)), constant_values=-1), -1
    )  # [B, gamma + 1]
    history, sources, rejected = (
        _write_rows(whole, part, lengths + 1)
        for whole, part in (
            (state.history, block),
            (state.sources, sources),
            (state.rejected, rejected),
        )
    )

    # Statistics over the drafts judged, up to EOS and max_decode_len.
    num_judged = jnp.minimum(jnp.minimum(num_accepted + 1, gamma), num_emitted)
    judged = block_positions[:, :-1] < num_judged[:, None]  # [B, gamma]
    num_kept = jnp.minimum(num_accepted, num_emitted)  # Accepted and emitted.
    return SpeculativeLoopState(
        cur_index=state.cur_index + 1,
        history=history,
        sources=sources,
        rejected=rejected,
        lengths=new_lengths,
        done=state.done | hit_eos | (new_lengths >= max_decode_len),
        target_cache=target_cache.replace(lengths=new_lengths),
        draft_cache=draft_cache,
        target_calls=state.target_calls + (~state.done).astype(jnp.int32),
        drafted_tokens=state.drafted_tokens + num_judged,
        accepted_tokens=state.accepted_tokens + num_kept,
        beta_sum=state.beta_sum + jnp.sum(jnp.where(judged, beta, 0.0), axis=1),
        nonfinite=state.nonfinite
        | (~state.done & jnp.any(sampling.nonfinite_rows(target_logits), 1)),
    )

  zeros = jnp.zeros((batch_size,), jnp.int32)
  history_shape = (batch_size, max_decode_len + gamma + 2)
  state = jax.lax.while_loop(
      cond_fn,
      body_fn,
      SpeculativeLoopState(
          cur_index=jnp.array(0, jnp.int32),
          history=jnp.full(history_shape, decoding.BOS_ID, jnp.int32),
          sources=jnp.full(history_shape, PADDING, jnp.int32),
          rejected=jnp.full(history_shape, -1, jnp.int32),
          lengths=zeros,
          done=jnp.zeros((batch_size,), bool),
          target_cache=target_cache,
          draft_cache=draft_cache,
          target_calls=zeros,
          drafted_tokens=zeros,
          accepted_tokens=zeros,
          beta_sum=jnp.zeros((batch_size,), jnp.float32),
          nonfinite=jnp.zeros((batch_size,), bool),
      ),
  )
  emitted = slice(1, max_decode_len + 1)
  positions = jnp.arange(max_decode_len)[None, :]  # [1, max_decode_len]
  emitted_mask = positions < state.lengths[:, None]  # [B, max_decode_len]
  result = SpeculativeResult(
      sequences=decoding.mask_after_lengths(
          state.history[:, emitted], state.lengths
      ),
      token_sources=jnp.where(emitted_mask, state.sources[:, emitted], PADDING),
      rejected_tokens=jnp.where(emitted_mask, state.rejected[:, emitted], -1),
      lengths=state.lengths,
      target_calls=state.target_calls,
      drafted_tokens=state.drafted_tokens,
      accepted_tokens=state.accepted_tokens,
      beta_sum=state.beta_sum,
      nonfinite=state.nonfinite,
  )
  if return_caches:
    return result, state.target_cache, state.draft_cache
  return result
