"""Logits to sampling distributions, and sampling from them.

Speculative decoding is lossless for whatever distribution the target samples
from, provided that the draft's proposals are drawn from, and scored by, the
same transformation of the draft's logits (Leviathan et al., 2023, sections 2.2
and 6). So every loop in this package turns logits into probabilities with the
one function `logits_to_probs`, applied identically to target and draft, and
samples with `sample`. Keeping the two apart (as gpt-fast does) lets the
speculative loop score a drafted token under the very distribution it was drawn
from.
"""

import dataclasses

import jax
import jax.numpy as jnp

from spec_decode import checks


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How logits become a sampling distribution.

  Applied in this order: temperature, then top-k, then top-p (the order of
  Hugging Face's default logits processors).

  A pytree whose leaves are the temperature and top_p, and whose structure is
  what a compiled loop's shapes and branches depend on: whether it is greedy,
  top_k, and whether top_p is below 1. So jitted loops take it as an ordinary
  argument, and one compiled loop serves every temperature above 0 and every
  top_p below 1 (a sweep or a notebook that changes them compiles once), as
  vLLM passes its sampling parameters to a compiled model as arrays. Top-k
  stays static: `jax.lax.top_k` needs k at compile time.

  Attributes:
    temperature: Divides the logits. 0 means greedy: a one-hot on the argmax,
      ties going to the lowest token id.
    top_k: Keeps the tokens whose logit is at least the k-th largest (so ties
      at the boundary are all kept). 0 keeps all tokens.
    top_p: Nucleus sampling: keeps the smallest set of most probable tokens
      whose mass reaches top_p (tokens tied with the least probable kept token
      are kept too). 1 keeps all tokens.
    greedy: temperature == 0 (set from it).
    nucleus: top_p < 1 (set from it).
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not (checks.is_number(self.temperature) and self.temperature >= 0):
      raise ValueError(f"temperature must be >= 0, got {self.temperature!r}.")
    if not (checks.is_int(self.top_k) and self.top_k >= 0):
      raise ValueError(f"top_k must be an int >= 0, got {self.top_k!r}.")
    if not (checks.is_number(self.top_p) and 0 < self.top_p <= 1):
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}.")
    # Python floats, whatever was given: the leaves of every config then
    # have one dtype, and share a compiled loop.
    object.__setattr__(self, "temperature", float(self.temperature))
    object.__setattr__(self, "top_p", float(self.top_p))
    object.__setattr__(self, "greedy", self.temperature == 0)
    object.__setattr__(self, "nucleus", self.top_p < 1)

  def tree_flatten(self):
    structure = (self.greedy, self.top_k, self.nucleus)
    return (self.temperature, self.top_p), structure

  @classmethod
  def tree_unflatten(cls, structure, leaves):
    config = object.__new__(cls)
    for name, value in zip(("temperature", "top_p"), leaves):
      object.__setattr__(config, name, value)
    for name, value in zip(("greedy", "top_k", "nucleus"), structure):
      object.__setattr__(config, name, value)
    return config


def logits_to_probs(logits: jax.Array, config: SamplingConfig) -> jax.Array:
  """Turns logits into the distribution that `config` samples from.

  Args:
    logits: [..., V] logits of any float dtype, e.g. [B, V] or [B, T, V]. May
      hold -inf for impossible tokens, as long as one token per row is finite.
    config: The temperature, top-k and top-p to apply.

  Returns:
    float32 [..., V] probabilities summing to 1 over the last axis, computed in
    float32 whatever the dtype of `logits`.
  """
  logits = logits.astype(jnp.float32)
  if config.greedy:
    return jax.nn.one_hot(
        greedy_tokens(logits), logits.shape[-1], dtype=jnp.float32
    )
  logits = logits / config.temperature
  bounded = 0 < config.top_k < logits.shape[-1]
  if bounded:
    kth_largest = jax.lax.top_k(logits, config.top_k)[0][..., -1:]
    logits = jnp.where(logits >= kth_largest, logits, -jnp.inf)
  probs = jax.nn.softmax(logits, axis=-1)
  if config.nucleus:
    if bounded:
      # The nucleus lies within the top k: their descending probabilities
      # [..., k] are all it needs (a token tied with the k-th has its
      # probability), with no sort of the vocabulary.
      sorted_probs = jax.lax.top_k(probs, config.top_k)[0]
    else:
      sorted_probs = -jnp.sort(-probs, axis=-1)  # [..., V], descending
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    # The least probable kept token: the last one whose predecessors hold less
    # than top_p. The first token always qualifies, so the min is positive.
    threshold = jnp.min(
        jnp.where(mass_before < config.top_p, sorted_probs, jnp.inf),
        axis=-1,
        keepdims=True,
    )
    probs = jnp.where(probs >= threshold, probs, 0.0)
    probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
  return probs


def greedy_tokens(logits: jax.Array) -> jax.Array:
  """The argmax of each row, ties going to the lowest token id.

  What sampling from `logits_to_probs` at temperature 0 draws, without the
  one-hot. Written as two plain reductions, which XLA:CPU runs about 7x
  faster than `jnp.argmax`'s variadic one.

  Args:
    logits: float [..., V].

  Returns:
    int32 [...] token ids, always in [0, V): a row with a NaN logit (whose
    max is NaN, equal to nothing) gives V - 1. The loops count such rows.
  """
  vocab_size = logits.shape[-1]
  best = jnp.max(logits, axis=-1, keepdims=True)  # [..., 1]
  ids = jnp.arange(vocab_size, dtype=jnp.int32)
  first = jnp.min(jnp.where(logits == best, ids, vocab_size), axis=-1)
  return jnp.minimum(first, vocab_size - 1)


def nonfinite_rows(logits: jax.Array) -> jax.Array:
  """bool [...]: whether a row of a model's float [..., V] logits holds NaN or
  +-inf (which a model never outputs unless its weights or numerics broke)."""
  return ~jnp.all(jnp.isfinite(logits), axis=-1)


def choose(
    uniforms: jax.Array, logits: jax.Array, config: SamplingConfig
) -> tuple[jax.Array, jax.Array | None]:
  """Draws a token per row from `logits` as `config` says, and its law.

  Args:
    uniforms: float32 [..., 2] in [0, 1), the draws' randomness (see
      `draw_uniforms`). Unused when greedy: a greedy loop that draws them
      compiles to none.
    logits: float [..., V].
    config: How logits become the sampling distribution.

  Returns:
    tokens: int32 [...] the draws.
    probs: float32 [..., V] the distribution they were drawn from, or None
      when greedy: that is the one-hot of `tokens`, never materialized, so a
      greedy step costs one pass over the logits.
  """
  if config.greedy:
    return greedy_tokens(logits), None
  probs = logits_to_probs(logits, config)
  return draw(uniforms, probs), probs


# Tokens per block of the two-level sampler: it draws a block, then a token
# in it, so each draw scans V / _BLOCK block sums and _BLOCK weights.
_BLOCK = 64


def _inverse_cdf(uniform: jax.Array, weights: jax.Array) -> jax.Array:
  """Index i with probability weights[..., i] / sum(weights[...]), for
  `uniform` [...] uniform in [0, 1)."""
  cdf = jnp.cumsum(weights, axis=-1)  # [..., N]
  # In (0, total].
  u = (1.0 - uniform[..., None]) * cdf[..., -1:]
  return pick(weights, cdf, u)


def pick(weights: jax.Array, cdf: jax.Array, u: jax.Array) -> jax.Array:
  """The first index of positive weight whose cdf reaches u.

  `jnp.cumsum` lowers to a tree of partial sums, so at the ulp level the
  computed cdf is not monotone, and a weight-0 index can have cdf[i] !=
  cdf[i - 1]: the textbook count of cdf < u would then draw it now and then
  (about 1e-7 per draw). Only indices of positive weight are candidates here;
  when rounding leaves u above every candidate's cdf, the last one is taken.

  Args:
    weights: float32 [..., N] non-negative weights.
    cdf: float32 [..., N] their cumulative sums.
    u: float32 [..., 1] in (0, cdf[..., -1]].

  Returns:
    int32 [...] an index of positive weight; 0 for a row with none (NaN
    weights), so that it always lies in [0, N).
  """
  size = weights.shape[-1]
  ids = jnp.arange(size, dtype=jnp.int32)
  positive = weights > 0
  first = jnp.min(jnp.where(positive & (cdf >= u), ids, size), axis=-1)
  last = jnp.max(jnp.where(positive, ids, 0), axis=-1)
  return jnp.minimum(first, last)


def draw_uniforms(rng: jax.Array, batch_shape) -> jax.Array:
  """The randomness of a batch of draws: float32 [*batch_shape, 2] in [0, 1).

  One PRNG call for all of them: each call is a threefry hash (on CPU, a
  rolled loop of 5 iterations of a dozen small ops). When each draw split
  its own key for its two uniforms and each draft step folded its index into
  a key, a speculative iteration at temperature 1 made 4 calls per draft and
  6 more; with the draft's uniforms drawn at once it makes 7 whatever gamma
  (`PrngCallsTest`; README, "Loop overhead").

  Args:
    rng: A PRNG key.
    batch_shape: the draws' shape, e.g. (B,) or (B, gamma).
  """
  return jax.random.uniform(rng, tuple(batch_shape) + (2,), jnp.float32)


def sample(rng: jax.Array, probs: jax.Array) -> jax.Array:
  """`draw` with the uniforms of `rng` (one PRNG call)."""
  return draw(draw_uniforms(rng, probs.shape[:-1]), probs)


def draw(uniforms: jax.Array, probs: jax.Array) -> jax.Array:
  """Draws one token per row from (possibly unnormalized) probabilities.

  By inverse CDF in two levels: a block of _BLOCK tokens in proportion to its
  mass, then a token within it. Two uniforms per row instead of V Gumbel
  draws (about 20x faster on CPU at V = 4096, 60x at 32128), and the float32
  cumulative sums run over at most max(V / _BLOCK, _BLOCK) terms.

  Args:
    uniforms: float32 [..., 2] independent uniforms in [0, 1): the first
      picks the block, the second the token in it.
    probs: float [..., V] non-negative weights with a positive sum per row.
      They need not be normalized, and tokens of weight 0 are never drawn (at
      either level: see `pick`).

  Returns:
    int32 [...] token ids, independent across rows (given independent
    uniforms), always in [0, V) (0 for a row of NaN weights).
  """
  probs = probs.astype(jnp.float32)
  batch_shape, vocab_size = probs.shape[:-1], probs.shape[-1]
  pad = [(0, 0)] * len(batch_shape) + [(0, -vocab_size % _BLOCK)]
  blocks = jnp.pad(probs, pad).reshape(
      batch_shape + (-1, _BLOCK)
  )  # [..., ceil(V / _BLOCK), _BLOCK]
  block = _inverse_cdf(uniforms[..., 0], jnp.sum(blocks, axis=-1))  # [...]
  in_block = jnp.take_along_axis(blocks, block[..., None, None], axis=-2)
  token = _inverse_cdf(uniforms[..., 1], in_block[..., 0, :])  # [...]
  return block * _BLOCK + token
