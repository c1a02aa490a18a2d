"""The verification step of speculative decoding: token-wise and block.

Given a drafted block x_1..x_gamma, the draft's distributions q_1..q_gamma
it came from and the target's p_1..p_{gamma+1} (p_i follows x_1..x_{i-1}), a
verifier keeps a prefix x_1..x_tau and draws one more token, so that the
emitted tokens follow the target exactly, for any draft.

- 'token' (Leviathan, Kalman & Matias, ICML 2023, Algorithm 1): x_i is kept
  with probability min(1, p_i(x_i) / q_i(x_i)), independently; tau is the
  number of leading kept tokens.
- 'block' (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami & Suresh,
  "Block Verification Accelerates Speculative Decoding", ICLR 2025,
  arXiv:2403.10444, Algorithm 2): the block is judged jointly, through the
  path weights w_0 = 1, w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i)), and keeps
  x_1..x_tau for the longest i whose own coin passes a stop probability h_i.
  Its expected tau is never below the token-wise one, and is the largest of
  any valid verifier that sees only the drafted path.

Both take every array with a leading batch axis and decide each row on its
own, with fixed shapes, so that they run inside the jitted decoding loop.
`num_drafted` (int32 [B]) lets a row verify only its first num_drafted[b]
drafts (the drafts after it were never proposed: see `speculative`'s early
stop); None verifies all gamma.

Greedy decoding (one-hot p and q) needs neither: both verifiers then keep
exactly the leading drafts that match the target's argmax, which
`verify_greedy` computes from the logits alone.
"""

import jax
import jax.numpy as jnp

from spec_decode import sampling

VERIFIERS = ("token", "block")


def accepted_count(
    coins: jax.Array,
    target_token_probs: jax.Array,
    draft_token_probs: jax.Array,
) -> jax.Array:
  """Counts the leading accepted drafted tokens of each row (token-wise).

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
  target_probs may be scaled (the block verifier passes w * p).

  Args:
    target_probs: float32 [..., V].
    draft_probs: float32 [..., V].

  Returns:
    float32 [..., V] non-negative weights with a positive sum, for `sample`.
  """
  residual = jnp.maximum(target_probs - draft_probs, 0.0)
  has_mass = jnp.sum(residual, axis=-1, keepdims=True) > 0
  return jnp.where(has_mass, residual, target_probs)


def _drafted_mask(draft_tokens, num_drafted):
  """bool [B, gamma]: which drafts each row proposed."""
  if num_drafted is None:
    return jnp.ones(draft_tokens.shape, bool)
  positions = jnp.arange(draft_tokens.shape[1])[None, :]  # [1, gamma]
  return positions < num_drafted[:, None]


def _token_probs(target_probs, draft_probs, draft_tokens):
  """p_i(x_i) and q_i(x_i): float32 [B, gamma] each."""
  tokens = draft_tokens[..., None]  # [B, gamma, 1]
  return (
      jnp.take_along_axis(target_probs[:, :-1], tokens, -1)[..., 0],
      jnp.take_along_axis(draft_probs, tokens, -1)[..., 0],
  )


def _padded(draft_probs, drafted):
  """q with 0 after each row's last draft: float32 [B, gamma + 1, V].

  The residual max(0, w p - 0) past the last draft is the target's own
  distribution: the bonus token needs no branch.
  """
  draft_probs = jnp.where(drafted[..., None], draft_probs, 0.0)
  return jnp.pad(draft_probs, ((0, 0), (0, 1), (0, 0)))


def _next_tokens(rng, target_probs, padded_draft_probs, num_accepted, weight):
  """Draws from residual(weight * p_{n+1}, q_{n+1}) at n = num_accepted."""
  position = num_accepted[:, None, None]  # [B, 1, 1]
  next_probs = residual_probs(
      weight[:, None] * jnp.take_along_axis(target_probs, position, 1)[:, 0],
      jnp.take_along_axis(padded_draft_probs, position, 1)[:, 0],
  )  # [B, V]
  return sampling.sample(rng, next_probs)


def overlap(target_probs: jax.Array, draft_probs: jax.Array) -> jax.Array:
  """beta = sum_x min(p_i(x), q_i(x)): float32 [B, gamma]."""
  return jnp.sum(jnp.minimum(target_probs[:, :-1], draft_probs), axis=-1)


def verify(
    coin_rng: jax.Array,
    residual_rng: jax.Array,
    target_probs: jax.Array,
    draft_probs: jax.Array,
    draft_tokens: jax.Array,
    num_drafted: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Token-wise verification: how many drafts to keep, and the next token.

  Worked example (pinned by a test). gamma = 2, V = 4, a row drafts x = [2, 1]
  with
    draft_probs  = [[.1, .2, .5, .2], [.1, .4, .3, .2]]
    target_probs = [[.1, .1, .6, .2], [.3, .1, .3, .3], ...]
  and draws coins [.9, .5]. x_1 = 2: .9 * .5 = .45 < .6, accepted. x_2 = 1:
  .5 * .4 = .2 >= .1, rejected. So n = 1, and the next token is drawn from
  max(0, [.3, .1, .3, .3] - [.1, .4, .3, .2]) = [.2, 0, 0, .1], normalized
  [2/3, 0, 0, 1/3]: the row emits [2, 0] or [2, 3] and advances by 2.

  Args:
    coin_rng: Key for the acceptance coins.
    residual_rng: Key for the next token.
    target_probs: float32 [B, gamma + 1, V] the target's distributions after
      the last committed token and after each drafted token.
    draft_probs: float32 [B, gamma, V] the distributions the drafts came from.
    draft_tokens: int32 [B, gamma] the drafted tokens.
    num_drafted: int32 [B] drafts proposed per row, or None for gamma.

  Returns:
    num_accepted: int32 [B] in 0..num_drafted, accepted drafts per row.
    next_tokens: int32 [B] drawn from the residual at position num_accepted,
      or from target_probs[:, num_drafted] (the bonus token) after a full
      accept.
    beta: float32 [B, gamma] sum_x min(target_probs_i(x), draft_probs_i(x)).
  """
  drafted = _drafted_mask(draft_tokens, num_drafted)
  target_token_probs, draft_token_probs = _token_probs(
      target_probs, draft_probs, draft_tokens
  )
  coins = jax.random.uniform(coin_rng, draft_tokens.shape, jnp.float32)
  num_accepted = accepted_count(
      coins,
      jnp.where(drafted, target_token_probs, 0.0),
      draft_token_probs,
  )
  next_tokens = _next_tokens(
      residual_rng,
      target_probs,
      _padded(draft_probs, drafted),
      num_accepted,
      jnp.ones(num_accepted.shape, jnp.float32),
  )
  return num_accepted, next_tokens, overlap(target_probs, draft_probs)


def block_weights(
    target_probs: jax.Array,
    draft_probs: jax.Array,
    draft_tokens: jax.Array,
    num_drafted: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """The block verifier's path weights and stop probabilities.

  With k = num_drafted[b] and q_{k+1} = 0 (nothing drafted there):

    w_0 = 1,  w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))       (i <= k)
    h_i = r_i / (r_i + 1 - w_i),  r_i = sum_x max(0, w_i p_{i+1}(x) - q_{i+1}(x))

  so h_k = w_k. Past k, w_i = h_i = 0. Where r_i + 1 - w_i = 0 (w_i = 1 and
  p_{i+1} = q_{i+1}), the next weight is 1 as well and tau > i for certain,
  so h_i does not matter; it is 0 here.

  Args:
    target_probs: float32 [B, gamma + 1, V].
    draft_probs: float32 [B, gamma, V].
    draft_tokens: int32 [B, gamma].
    num_drafted: int32 [B] or None (see `verify`).

  Returns:
    weights: float32 [B, gamma + 1] w_0..w_gamma.
    stop_probs: float32 [B, gamma] h_1..h_gamma.
  """
  drafted = _drafted_mask(draft_tokens, num_drafted)
  target_token_probs, draft_token_probs = _token_probs(
      target_probs, draft_probs, draft_tokens
  )

  def step(weight, probs):
    target_prob, draft_prob = probs
    scaled = weight * target_prob
    # Divides only where scaled < draft_prob, so draft_prob > 0 there.
    safe = jnp.where(scaled < draft_prob, draft_prob, 1.0)
    weight = jnp.where(scaled < draft_prob, scaled / safe, 1.0)
    return weight, weight

  batch_size = draft_tokens.shape[0]
  _, weights = jax.lax.scan(
      step,
      jnp.ones((batch_size,), jnp.float32),
      (target_token_probs.T, draft_token_probs.T),
  )  # [gamma, B]
  weights = jnp.where(drafted, weights.T, 0.0)  # [B, gamma]
  next_target = target_probs[:, 1:]  # [B, gamma, V] p_{i+1}
  next_draft = _padded(draft_probs, drafted)[:, 1:]  # [B, gamma, V] q_{i+1}
  residual_mass = jnp.sum(
      jnp.maximum(weights[..., None] * next_target - next_draft, 0.0), axis=-1
  )  # [B, gamma]
  denominator = residual_mass + 1.0 - weights
  stop_probs = jnp.where(
      denominator > 0,
      residual_mass / jnp.where(denominator > 0, denominator, 1.0),
      0.0,
  )
  weights = jnp.pad(weights, ((0, 0), (1, 0)), constant_values=1.0)
  return weights, stop_probs


def block_accepted_count(coins: jax.Array, stop_probs: jax.Array) -> jax.Array:
  """tau: the largest i with coins_i < h_i, or 0. int32 [B].

  Args:
    coins: float32 [B, gamma] uniform draws in [0, 1) (the paper's eta).
    stop_probs: float32 [B, gamma] h_1..h_gamma (`block_weights`).
  """
  positions = jnp.arange(1, coins.shape[1] + 1)[None, :]  # [1, gamma]
  return jnp.max(
      jnp.where(coins < stop_probs, positions, 0), axis=-1, initial=0
  ).astype(jnp.int32)


def verify_block(
    coin_rng: jax.Array,
    residual_rng: jax.Array,
    target_probs: jax.Array,
    draft_probs: jax.Array,
    draft_tokens: jax.Array,
    num_drafted: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Block verification (Sun et al., ICLR 2025, Algorithm 2).

  Keeps x_1..x_tau, tau the largest i whose coin eta_i < h_i (0 if none;
  `block_weights` gives w and h), then draws the next token from
  max(0, w_tau p_{tau+1} - q_{tau+1}), normalized: the bonus token
  p_{gamma+1} after a full accept, as q_{gamma+1} = 0.

  Worked example (the paper's motivating one; pinned by a test). V = 2,
  p = (1/3, 2/3) and q = (2/3, 1/3) at every position, gamma = 2. Token-wise
  verification keeps on average 2/3 + 4/9 = 10/9 drafts; this keeps 11/9.
  For the draft x = [0, 1] (probability 2/9):
    w_1 = min(1, 1 * (1/3) / (2/3)) = 1/2,  w_2 = min(1, 1/2 * 2) = 1;
    h_1 = r_1 / (r_1 + 1/2) = 0, as r_1 = sum max(0, (1/6, 1/3) - (2/3, 1/3))
    = 0;  h_2 = w_2 = 1.
  So tau = 2 for every coin: both drafts are kept, where token-wise
  verification rejects x_1 = 0 half the time (and then loses x_2 too). For
  x = [1, 0]: w = (1, 1/2), h_1 = (1/3) / (1/3 + 0) = 1 and h_2 = 1/2, so
  x_1 is always kept and x_2 half the time; after tau = 1 the next token
  comes from max(0, p - q) = (0, 1/3): it is 1.

  Args:
    coin_rng, residual_rng, target_probs, draft_probs, draft_tokens,
      num_drafted: as `verify` takes them.

  Returns:
    num_accepted, next_tokens, beta: as `verify` returns them.
  """
  weights, stop_probs = block_weights(
      target_probs, draft_probs, draft_tokens, num_drafted
  )
  coins = jax.random.uniform(coin_rng, draft_tokens.shape, jnp.float32)
  num_accepted = block_accepted_count(coins, stop_probs)
  drafted = _drafted_mask(draft_tokens, num_drafted)
  next_tokens = _next_tokens(
      residual_rng,
      target_probs,
      _padded(draft_probs, drafted),
      num_accepted,
      jnp.take_along_axis(weights, num_accepted[:, None], axis=1)[:, 0],
  )
  return num_accepted, next_tokens, overlap(target_probs, draft_probs)


def verify_greedy(
    target_logits: jax.Array,
    draft_tokens: jax.Array,
    num_drafted: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Either verifier at temperature 0, from the target's logits alone.

  With one-hot target_probs and draft_probs the general rules reduce to
  comparisons: x_i is accepted (with any coin) exactly when it and every
  draft before it are the target's argmax, the residual after a rejection is
  the target's one-hot, and so is the bonus token's distribution. (Block
  verification gives the same: w_i is 1 up to the first mismatch and 0 after
  it, and h_i = 1 exactly where w_i = 1 and x_{i+1} mismatches, or i = k.)
  So this returns what `verify` and `verify_block` would, with no pass over
  the vocabulary beyond one argmax per position.

  Args:
    target_logits: float [B, gamma + 1, V] the target's logits.
    draft_tokens: int32 [B, gamma] the drafted (greedy) tokens.
    num_drafted: int32 [B] or None (see `verify`).

  Returns:
    num_accepted, next_tokens, beta: as `verify` returns them; beta is 1
    where the draft's argmax matched the target's and 0 elsewhere.
  """
  target_tokens = sampling.greedy_tokens(target_logits)  # [B, gamma + 1]
  matches = draft_tokens == target_tokens[:, :-1]  # [B, gamma]
  drafted = _drafted_mask(draft_tokens, num_drafted)
  num_accepted = jnp.sum(jnp.cumprod(matches & drafted, axis=-1), axis=-1)
  next_tokens = jnp.take_along_axis(
      target_tokens, num_accepted[:, None], axis=1
  )[:, 0]
  return (
      num_accepted.astype(jnp.int32),
      next_tokens,
      matches.astype(jnp.float32),
  )
