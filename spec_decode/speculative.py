"""Speculative decoding: Algorithm 1 of Leviathan, Kalman & Matias (ICML 2023).

Each iteration, for every row at once, the draft proposes up to gamma tokens,
the target scores all of them in one call, and a vectorized verifier (token-wise
or block, see `spec_decode.verify`) keeps a prefix of the proposals and adds one
token of its own. The output has exactly the distribution of sampling from the
target alone (Theorem 3.5 of the paper), for any draft, and every row advances
by its own count.

The whole decode is one jitted `lax.while_loop` with fixed shapes: nothing goes
back to the host until every row is done.

References:
  Y. Leviathan, M. Kalman, Y. Matias. Fast Inference from Transformers via
  Speculative Decoding. ICML 2023. arXiv:2211.17192.
  Z. Sun, U. Mendlovic, Y. Leviathan, A. Aharoni, J. H. Ro, A. Beirami,
  A. T. Suresh. Block Verification Accelerates Speculative Decoding.
  ICLR 2025. arXiv:2403.10444.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp

from spec_decode import checks
from spec_decode import decoding
from spec_decode import draft_loop
from spec_decode import key_buckets
from spec_decode import sampling
from spec_decode import speculative_result as result_lib
from spec_decode import speculative_state as state_lib
from spec_decode import verify as verify_lib

# The token-wise kernels, under the names they had before spec_decode.verify.
accepted_count = verify_lib.accepted_count
residual_probs = verify_lib.residual_probs
verify = verify_lib.verify
verify_greedy = verify_lib.verify_greedy

# fold_in tags that split an iteration's key into independent streams.
_DRAFT_STREAM = 0
_COIN_STREAM = 1
_RESIDUAL_STREAM = 2

# What the loop returns, and where each emitted token came from; also
# importable from here.
SpeculativeResult = result_lib.SpeculativeResult
PADDING = result_lib.PADDING
ACCEPTED = result_lib.ACCEPTED
REPLACEMENT = result_lib.REPLACEMENT
BONUS = result_lib.BONUS
SpeculativeLoopState = state_lib.SpeculativeLoopState


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
    verifier: str = "block",
    draft_threshold: float | draft_loop.Threshold = 0.0,
    return_caches: bool = False,
) -> SpeculativeResult | tuple[SpeculativeResult, Any, Any]:
  """Samples from the target, up to gamma drafted tokens per target call.

  One iteration, for every row b at once, with len = lengths[b]:

  1. Draft: feed the 2-token chunk [history[len - 1], history[len]] at
     position len - 1 (at len = 0, BOS alone), then up to gamma - 1 single
     drafted tokens, sampling x_i ~ draft_probs_i. With a draft_threshold, a
     row proposes x_1..x_k, k the first i whose confidence (draft_probs_i(x_i)
     when sampling, the draft's max softmax probability when greedy) is below
     the threshold, and the draft stops once every live row has (so at batch
     1, after x_k). The decision uses the draft's own tokens alone, so the
     output stays exact.
  2. Target: one call on [history[len], x_1..x_gamma] at position len gives
     target_probs_1..target_probs_{gamma+1}.
  3. Verify (`spec_decode.verify`, token-wise or block): n accepted drafts,
     then the next token from the residual at n + 1 (the bonus token from
     target_probs_{k+1} when n = k, the drafts proposed).
  4. Commit x_1..x_n and the next token, cut after EOS and at
     max_decode_len; roll the target cache back to the new length.

  The draft cache needs no catch-up step of its own: its first call of each
  iteration re-writes position len - 1 and writes len, so it sees x_gamma
  after a full accept and always the token the target added. Re-writing an
  entry with the same prefix is harmless under the overwrite semantics of the
  cache. This way the draft runs gamma calls per iteration (gpt-fast runs an
  extra one) and no target step is spent before the loop: with the target as
  its own draft, n tokens take exactly ceil(n / (gamma + 1)) target calls.
  `spec_decode.verify` gives a worked example of each verifier.

  Args:
    target_fn: The target's decode function (see `decoding.DecodeFn`).
    draft_fn: The draft's decode function; may be `target_fn` itself.
    target_cache: The target's empty cache (lengths 0), with room for
      max_decode_len + gamma + 1 positions.
    draft_cache: The draft's empty cache, with the same room; may be
      `target_cache` itself.
    decode_rng: A PRNG key. Iteration i uses fold_in(decode_rng, i), split by
      fold_in into independent streams for drafts, coins and residuals.
    gamma: Tokens drafted per iteration (the most, with a draft_threshold),
      >= 1.
    max_decode_len: Most tokens to emit per row.
    eos_id: A row stops after emitting this token (an id outside the
      vocabulary, such as -1, disables EOS).
    config: How logits become the sampling distribution, for target and draft
      alike.
    verifier: 'token' (Leviathan et al., Algorithm 1) or 'block' (Sun et al.,
      Algorithm 2: never fewer accepted drafts on average). Greedy decoding
      is the same under both.
    draft_threshold: stop drafting early below this confidence, in [0, 1);
      0 always drafts gamma tokens. A float, or a `draft_loop.Threshold`
      (as the Engine passes it, placed): the loop is compiled once for every
      threshold above 0.
    return_caches: also return the final target and draft caches, so that a
      caller that donates the caches gets them back in the same memory.

  Returns:
    A `SpeculativeResult`, and with `return_caches` the two caches.
  """
  if not checks.is_int(gamma) or gamma < 1:
    raise ValueError(f"gamma must be an int >= 1, got {gamma!r}.")
  if verifier not in verify_lib.VERIFIERS:
    raise ValueError(
        f"verifier must be one of {verify_lib.VERIFIERS}, got {verifier!r}."
    )
  if not isinstance(draft_threshold, draft_loop.Threshold):
    draft_threshold = draft_loop.Threshold(draft_threshold)
  decoding.check_decode_args(max_decode_len, eos_id)
  # Every write of the last target call lands in the caches.
  why = (
      f"max_decode_len {max_decode_len} and gamma {gamma} "
      "(drafts.speculative_capacity)"
  )
  for name, cache in (
      ("target_cache", target_cache),
      ("draft_cache", draft_cache),
  ):
    decoding.check_capacity(cache, max_decode_len + gamma + 1, name, why)
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
      verifier=verifier,
      draft_threshold=draft_threshold,
      return_caches=return_caches,
  )


def _verify(
    iteration_rng,
    target_logits,
    draft_tokens,
    draft_probs,
    num_drafted,
    *,
    config,
    verifier,
):
  """Step 3: num_accepted [B], next_tokens [B], beta [B, gamma]."""
  if config.greedy:
    return verify_lib.verify_greedy(target_logits, draft_tokens, num_drafted)
  kernel = verify_lib.verify_block if verifier == "block" else verify_lib.verify
  return kernel(
      jax.random.fold_in(iteration_rng, _COIN_STREAM),
      jax.random.fold_in(iteration_rng, _RESIDUAL_STREAM),
      sampling.logits_to_probs(target_logits, config),
      draft_probs,
      draft_tokens,
      num_drafted,
  )


def _iteration(
    state: state_lib.SpeculativeLoopState,
    *,
    target_fn,
    draft_fn,
    decode_rng,
    gamma,
    max_decode_len,
    eos_id,
    config,
    verifier,
    draft_threshold,
) -> state_lib.SpeculativeLoopState:
  """One iteration of the loop: draft, score, verify, commit."""
  lengths = state.lengths
  iteration_rng = jax.random.fold_in(decode_rng, state.cur_index)
  draft_tokens, draft_probs, num_drafted, draft_steps, draft_cache = (
      draft_loop.propose(
          draft_fn,
          state.draft_cache,
          state.history,
          lengths,
          state.done,
          jax.random.fold_in(iteration_rng, _DRAFT_STREAM),
          gamma=gamma,
          config=config,
          threshold=draft_threshold,
      )
  )
  last_tokens = jnp.take_along_axis(state.history, lengths[:, None], axis=1)
  target_logits, target_cache = target_fn(
      jnp.concatenate([last_tokens, draft_tokens], axis=1),  # [B, gamma + 1]
      state.target_cache,
  )
  num_accepted, next_tokens, beta = _verify(
      iteration_rng,
      target_logits,
      draft_tokens,
      draft_probs,
      num_drafted if draft_threshold.early_stop else None,
      config=config,
      verifier=verifier,
  )

  return state_lib.advance(
      state,
      draft_tokens,
      state_lib.commit(
          draft_tokens,
          num_accepted,
          next_tokens,
          num_drafted,
          lengths,
          state.done,
          eos_id=eos_id,
          max_decode_len=max_decode_len,
      ),
      num_accepted=num_accepted,
      num_drafted=num_drafted,
      beta=beta,
      draft_steps=draft_steps,
      target_cache=target_cache,
      draft_cache=draft_cache,
      nonfinite=sampling.nonfinite_rows(target_logits),
      max_decode_len=max_decode_len,
  )


@jax.jit(
    static_argnames=(
        "gamma",
        "max_decode_len",
        "eos_id",
        "verifier",
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
    verifier,
    draft_threshold,
    return_caches,
):
  """`speculative_decode` after argument checks."""
  body_fn = functools.partial(
      _iteration,
      target_fn=target_fn,
      draft_fn=draft_fn,
      decode_rng=decode_rng,
      gamma=gamma,
      max_decode_len=max_decode_len,
      eos_id=eos_id,
      config=config,
      verifier=verifier,
      draft_threshold=draft_threshold,
  )
  state = key_buckets.while_loop(
      lambda state: jnp.any(~state.done),
      body_fn,
      state_lib.initial_state(
          target_cache, draft_cache, history_len=max_decode_len + gamma + 2
      ),
      cache_fields=("target_cache", "draft_cache"),
      # The target's gamma + 1 queries sit at lengths .. lengths + gamma; the
      # draft's, one behind.
      num_keys_fn=lambda state: jnp.max(state.lengths) + gamma + 1,
  )
  result = result_lib.from_loop_state(state, max_decode_len)
  if return_caches:
    return result, state.target_cache, state.draft_cache
  return result
