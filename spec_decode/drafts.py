"""Draft models for speculative decoding, behind one interface.

A draft is a decode function (`decoding.DecodeFn`) and its empty cache, like
the target; `speculative_decode` samples from it with the target's own
`SamplingConfig`. Three kinds:

- a smaller T5 (`t5_draft`): its bound decode function and cache, set up as
  for the target; a shared-encoder T5 draft has no encoder and reads the
  target's encoding (`shared_encoder_caches`); `t5_pair` sets up a target and
  a T5 draft of either kind;
- n-gram models counted over a token corpus (`count_unigrams`,
  `count_bigrams`), whose "cache" is only the lengths (Leviathan et al., 2023,
  Table 3 reports alpha 0.07-0.13 for unigram and 0.16-0.23 for bigram drafts);
- the target itself (`target_as_draft`), for which alpha is exactly 1.

The n-gram models are unsmoothed maximum-likelihood estimates. Smoothing is not
needed for correctness: a token with draft probability 0 is never drafted, and
the residual max(0, target_probs - draft_probs) gives it all of its target
mass. Add-k smoothing would only move draft mass onto tokens the corpus never
shows after the context, which raises alpha = E[sum_x min(p, q)] only where the
target favors such tokens. What is needed is a distribution after every
context: a bigram context the corpus never shows backs off to the unigram.
"""

from typing import Any, Iterable, NamedTuple, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import decoding
from spec_decode import inputs as inputs_lib
from spec_decode.models import decode_cache
from spec_decode.models import t5

# A speculative cache's room past max_decode_len comes in whole steps of this
# many positions, so that every gamma up to CAPACITY_STEP - 1 has the same
# caches: a gamma sweep compiles the set-up and the one-token calls once.
CAPACITY_STEP = 8


def speculative_capacity(max_decode_len: int, gamma: int) -> int:
  """The decoder positions a speculative decoder's caches hold.

  The last target call may write gamma + 1 positions past max_decode_len, so
  the caches need max_decode_len + gamma + 1; the room past max_decode_len is
  rounded up to whole CAPACITY_STEPs (at most CAPACITY_STEP - 1 positions
  more), so that it does not depend on gamma. The free positions are masked:
  they change no token.

  Args:
    max_decode_len: the tokens each row may emit.
    gamma: the draft tokens per iteration.

  Returns:
    max_decode_len + CAPACITY_STEP * ceil((gamma + 1) / CAPACITY_STEP).
  """
  return max_decode_len + -(-(gamma + 1) // CAPACITY_STEP) * CAPACITY_STEP


class Draft(NamedTuple):
  """A draft model ready for `speculative_decode`.

  Attributes:
    decode_fn: The draft's decode function.
    cache: Its empty cache (lengths 0), with room for at least
      max_decode_len + gamma + 1 positions (`speculative_capacity`).
  """

  decode_fn: decoding.DecodeFn
  cache: Any


@flax.struct.dataclass
class NgramCache:
  """An n-gram draft's cache: the model needs only the fed token.

  Attributes:
    lengths: int32 [B] tokens fed per row.
  """

  lengths: jax.Array

  def logical_axes(self):
    """The cache's structure with each leaf's logical axes."""
    return NgramCache(lengths=jax.sharding.PartitionSpec("cache_batch"))


@flax.struct.dataclass
class NgramModel:
  """A unigram or bigram model as a decode function.

  Attributes:
    context_rows: int32 [V] the row of `log_probs` to use after each token.
    log_probs: float32 [C, V] next-token log-probabilities, one row per context
      (a unigram model has one row; -inf for tokens never seen).
  """

  context_rows: jax.Array
  log_probs: jax.Array

  def logical_axes(self):
    """Replicated: the tables are small and every row reads any of them."""
    return NgramModel(
        jax.sharding.PartitionSpec(), jax.sharding.PartitionSpec()
    )

  def init_cache(self, batch_size: int) -> NgramCache:
    return NgramCache(lengths=jnp.zeros((batch_size,), jnp.int32))

  def __call__(
      self, tokens: jax.Array, cache: NgramCache
  ) -> tuple[jax.Array, NgramCache]:
    """Returns logits [B, T, V] after each of tokens [B, T], and the cache."""
    logits = self.log_probs[self.context_rows[tokens]]  # [B, T, V]
    return logits, cache.replace(lengths=cache.lengths + tokens.shape[1])


def _flatten(sequences: Iterable[Sequence[int]], vocab_size: int):
  """Returns int64 [N] previous tokens (BOS first) and [N] tokens."""
  previous, current = [], []
  for sequence in sequences:
    sequence = np.asarray(sequence, np.int64).reshape(-1)
    current.append(sequence)
    previous.append(np.concatenate([[decoding.BOS_ID], sequence[:-1]]))
  if not current or not sum(len(sequence) for sequence in current):
    raise ValueError("The corpus holds no tokens.")
  previous, current = np.concatenate(previous), np.concatenate(current)
  if current.min() < 0 or current.max() >= vocab_size:
    raise ValueError(f"The corpus holds token ids outside [0, {vocab_size}).")
  return previous, current


def _log(counts: np.ndarray) -> np.ndarray:
  """Log of counts normalized over the last axis; -inf where a count is 0."""
  with np.errstate(divide="ignore"):
    return np.log(counts / counts.sum(axis=-1, keepdims=True))


def count_unigrams(
    sequences: Iterable[Sequence[int]], vocab_size: int
) -> NgramModel:
  """Estimates a unigram model: token frequencies over the corpus.

  Args:
    sequences: Token sequences, without BOS or padding (include EOS where the
      draft should propose it).
    vocab_size: V, the target's vocabulary size.

  Returns:
    An `NgramModel` with one row.
  """
  _, tokens = _flatten(sequences, vocab_size)
  counts = np.bincount(tokens, minlength=vocab_size)[None, :]  # [1, V]
  return NgramModel(
      context_rows=jnp.zeros((vocab_size,), jnp.int32),
      log_probs=jnp.asarray(_log(counts), jnp.float32),
  )


def count_bigrams(
    sequences: Iterable[Sequence[int]], vocab_size: int
) -> NgramModel:
  """Estimates a bigram model, backing off to unigrams for unseen contexts.

  Each sequence is preceded by BOS, so the first token is counted after BOS.
  Only contexts seen in the corpus get a row: memory is (contexts + 1) * V.

  Args:
    sequences: Token sequences, without BOS or padding (include EOS where the
      draft should propose it).
    vocab_size: V, the target's vocabulary size.

  Returns:
    An `NgramModel` with one row per context seen, plus the unigram row 0.
  """
  previous, tokens = _flatten(sequences, vocab_size)
  contexts, rows = np.unique(previous, return_inverse=True)
  counts = np.zeros((len(contexts) + 1, vocab_size), np.int64)
  counts[0] = np.bincount(tokens, minlength=vocab_size)
  np.add.at(counts, (rows + 1, tokens), 1)
  context_rows = np.zeros((vocab_size,), np.int32)
  context_rows[contexts] = np.arange(1, len(contexts) + 1)
  return NgramModel(
      context_rows=jnp.asarray(context_rows),
      log_probs=jnp.asarray(_log(counts), jnp.float32),
  )


def ngram_draft(model: NgramModel, batch_size: int) -> Draft:
  """An n-gram model and an empty cache for batch_size rows."""
  return Draft(decode_fn=model, cache=model.init_cache(batch_size))


def t5_cache(
    model: t5.Transformer,
    params: Any,
    encoder_input_tokens: jax.Array,
    max_length: int,
) -> decode_cache.DecodeCache:
  """Encodes a batch of inputs into an empty T5 decode cache.

  Args:
    model: The T5 module.
    params: Its parameters.
    encoder_input_tokens: int32 [B, S] inputs, 0 for padding.
    max_length: The cache's capacity: at least max_decode_len + gamma + 1
      for speculative decoding (`speculative_capacity`), max_decode_len for
      the baseline.

  Returns:
    The cache, with lengths 0.
  """
  encoded = model.apply(
      {"params": params}, encoder_input_tokens, method=t5.Transformer.encode
  )
  return empty_cache(model, params, encoded, encoder_input_tokens, max_length)


def shared_encoder_caches(
    target_model: t5.Transformer,
    target_params: Any,
    draft_model: t5.Transformer,
    draft_params: Any,
    encoder_input_tokens: jax.Array,
    max_length: int,
) -> tuple[decode_cache.DecodeCache, decode_cache.DecodeCache]:
  """The target's and a shared-encoder draft's empty caches, one encoding.

  The target encodes the inputs once; the draft's cross-attention reads that
  encoding through its projection (`t5.Transformer.encode`).

  Args:
    target_model: The target T5, with its own encoder.
    target_params: Its parameters.
    draft_model: A T5 whose config has shared_encoder_dim = the target's
      emb_dim.
    draft_params: Its parameters.
    encoder_input_tokens: int32 [B, S] inputs, 0 for padding.
    max_length: Both caches' capacity.

  Returns:
    (target cache, draft cache), with lengths 0.
  """
  encoded = target_model.apply(
      {"params": target_params},
      encoder_input_tokens,
      method=t5.Transformer.encode,
  )  # [B, S, E_target]
  draft_encoded = draft_model.apply(
      {"params": draft_params},
      encoder_input_tokens,
      target_encoded=encoded,
      method=t5.Transformer.encode,
  )  # [B, S, E_draft]
  return (
      empty_cache(
          target_model, target_params, encoded, encoder_input_tokens, max_length
      ),
      empty_cache(
          draft_model,
          draft_params,
          draft_encoded,
          encoder_input_tokens,
          max_length,
      ),
  )


def empty_cache(model, params, encoded, encoder_input_tokens, max_length):
  """An empty cache (lengths 0) whose cross-attention reads `encoded`.

  Args:
    model: the T5 that decodes from this cache.
    params: its parameters.
    encoded: [B, S, E] its `encode` of the inputs.
    encoder_input_tokens: int32 [B, S] inputs, 0 for padding.
    max_length: the cache's capacity, in decoder positions.

  Returns:
    The decode_cache.DecodeCache, its cross-attention keys padded to the
    least power of two >= S (`keys_in_octaves`).
  """
  encoded, encoder_input_tokens = keys_in_octaves(encoded, encoder_input_tokens)
  return model.apply(
      {"params": params},
      encoded,
      encoder_input_tokens,
      max_length,
      method=t5.Transformer.init_cache,
  )


def keys_in_octaves(encoded, encoder_input_tokens):
  """An encoding and its tokens, zero-padded to the least power of two >= S.

  `inputs.trim` cuts a batch to 2^k or 3 * 2^(k-1) columns, so that the
  encoder runs on little padding; the caches take only the powers of two,
  so that the decode loops, which compile for each cache shape, compile
  once an octave as before. The padding is masked like the inputs' own
  (its tokens are 0), so every cross-attention reads the same keys. Where
  max_input_len is no power of two, a full-length batch's cache then holds
  more keys than it has input positions (256 for 192), where it held as
  many before; `memory_plan` counts them.

  Args:
    encoded: [B, S, E] an encoding.
    encoder_input_tokens: int32 [B, S] its inputs, 0 for padding.

  Returns:
    ([B, S', E], int32 [B, S']), S' the least power of two >= S.
  """
  length = encoder_input_tokens.shape[1]
  pad = inputs_lib.octave(length) - length
  if not pad:
    return encoded, encoder_input_tokens
  return (
      jnp.pad(encoded, ((0, 0), (0, pad), (0, 0))),  # [B, S', E]
      jnp.pad(encoder_input_tokens, ((0, 0), (0, pad))),  # [B, S']
  )


def t5_draft(
    model: t5.Transformer,
    params: Any,
    encoder_input_tokens: jax.Array,
    max_length: int,
) -> Draft:
  """A T5 decoder for a batch of inputs: `t5_cache` and the bound params.

  The same call sets up a T5 target.
  """
  return Draft(
      decode_fn=t5.make_decode_fn(model, params),
      cache=t5_cache(model, params, encoder_input_tokens, max_length),
  )


def t5_pair(
    target_model: t5.Transformer,
    target_params: Any,
    draft_model: t5.Transformer,
    draft_params: Any,
    encoder_input_tokens: jax.Array,
    max_length: int,
) -> tuple[Draft, Draft]:
  """The target and a T5 draft for a batch of inputs, whatever the draft's kind.

  A draft with an encoder of its own encodes the inputs itself (`t5_draft`);
  a shared-encoder draft (config.shared_encoder_dim) reads the target's one
  encoding (`shared_encoder_caches`).

  Args:
    target_model: The target T5.
    target_params: Its parameters.
    draft_model: The draft T5.
    draft_params: Its parameters.
    encoder_input_tokens: int32 [B, S] inputs, 0 for padding.
    max_length: Both caches' capacity: at least max_decode_len + gamma + 1
      (`speculative_capacity`).

  Returns:
    (target Draft, draft Draft), their caches empty.
  """
  if not draft_model.config.shared_encoder_dim:
    return (
        t5_draft(target_model, target_params, encoder_input_tokens, max_length),
        t5_draft(draft_model, draft_params, encoder_input_tokens, max_length),
    )
  target_cache, draft_cache = shared_encoder_caches(
      target_model,
      target_params,
      draft_model,
      draft_params,
      encoder_input_tokens,
      max_length,
  )
  return (
      Draft(t5.make_decode_fn(target_model, target_params), target_cache),
      Draft(t5.make_decode_fn(draft_model, draft_params), draft_cache),
  )


def target_as_draft(target_fn: decoding.DecodeFn, target_cache: Any) -> Draft:
  """The target as its own draft: every drafted token is accepted.

  Tokens per target call are then gamma + 1 (Eq. 1 with alpha = 1) up to the
  end, which isolates the loop's own overhead.

  Args:
    target_fn: The target's decode function.
    target_cache: The target's empty cache, sized for speculative decoding.

  Returns:
    A `Draft`. Caches are immutable pytrees, so sharing one is safe.
  """
  return Draft(decode_fn=target_fn, cache=target_cache)
