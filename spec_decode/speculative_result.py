"""What speculative decoding returns: the tokens, their sources, the counts.

`spec_decode.speculative` runs the loop; `spec_decode.acceptance` and the
benchmarks read these fields.
"""

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import decoding

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
      drafted token the target rejected there; -1 elsewhere. (Block
      verification's replacement may equal it: its residual w p - q can
      keep mass on the rejected draft.)
    draft_calls: int32 [B] draft calls spent on the row while it was live
      (gamma per target call, fewer when the draft stops early).
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
  draft_calls: jax.Array
  nonfinite: jax.Array | None = None

  def acceptance_rate(self) -> jax.Array:
    """Empirical alpha: accepted / judged drafted tokens, over all rows."""
    return jnp.sum(self.accepted_tokens) / jnp.sum(self.drafted_tokens)

  def alpha_estimate(self) -> jax.Array:
    """The paper's alpha = E[beta] (Corollary 3.6), over positions judged."""
    return jnp.sum(self.beta_sum) / jnp.sum(self.drafted_tokens)

  def draft_calls_per_target_call(self) -> jax.Array:
    """Draft calls / target calls, over all rows: gamma without early stop."""
    return jnp.sum(self.draft_calls) / jnp.sum(self.target_calls)

  def tokens_per_target_call(self) -> jax.Array:
    """Emitted tokens / target calls, over all rows (Eq. 1 predicts it)."""
    return jnp.sum(self.lengths) / jnp.sum(self.target_calls)


def from_loop_state(state, max_decode_len: int) -> SpeculativeResult:
  """The emitted tokens and statistics of a final `SpeculativeLoopState`."""
  emitted = slice(1, max_decode_len + 1)
  positions = jnp.arange(max_decode_len)[None, :]  # [1, max_decode_len]
  emitted_mask = positions < state.lengths[:, None]  # [B, max_decode_len]
  return SpeculativeResult(
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
      draft_calls=state.draft_calls,
      nonfinite=state.nonfinite,
  )
