"""Prompt lookup: a draft with no model, which copies from the input.

The draft proposes the token that followed the most recent earlier
occurrence of the output's last n tokens (n = max_ngram down to 1), looked
up first in the output so far and then in the encoder input (Saxena's
prompt lookup decoding; vLLM's n-gram proposer). Its q is a one-hot on that
token, so the ordinary verify accepts it with probability p(token) and stays
exactly lossless; with no match it proposes EOS. Everything is in-graph:
the lookup of one position compares the key with every position of the
input and the output, O((S + C) n) per call, with no host round trip.

It pays where outputs copy spans of their input (summarization, extraction,
code editing) and where outputs repeat themselves; translation copies only
names and numbers.
"""

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import decoding
from spec_decode import inputs as inputs_lib


@flax.struct.dataclass
class LookupCache:
  """What the lookup draft reads: the input and the output so far.

  Attributes:
    lengths: int32 [B] tokens fed per row (output positions written).
    source: int32 [B, S] the encoder input tokens, 0 for padding.
    output: int32 [B, C] the fed tokens: BOS, then the output so far (C is
      the cache capacity); only the first `lengths` are valid.
  """

  lengths: jax.Array
  source: jax.Array
  output: jax.Array

  def logical_axes(self):
    """Rows split like the target's cache; positions whole."""
    spec = jax.sharding.PartitionSpec
    return LookupCache(
        lengths=spec("cache_batch"),
        source=spec("cache_batch", None),
        output=spec("cache_batch", None),
    )


def init_cache(source, capacity):
  """An empty cache for the inputs `source` (int32 [B, S])."""
  batch_size = source.shape[0]
  return LookupCache(
      lengths=jnp.zeros((batch_size,), jnp.int32),
      source=jnp.asarray(source, jnp.int32),
      output=jnp.zeros((batch_size, capacity), jnp.int32),
  )


def _last_match(text, valid, key, key_len, max_ngram):
  """For each n, the last j where text[j-n+1..j] equals the key's first n.

  Args:
    text: int32 [L] tokens.
    valid: bool [L] positions that may match and be followed (j + 1 < end).
    key: int32 [N] the output's last tokens, most recent first.
    key_len: int32 [] how many of them exist (n <= key_len).
    max_ngram: N.

  Returns:
    int32 [N] for n = 1..N, the matching j (-1 for none).
  """
  positions = jnp.arange(text.shape[0])
  # [N, L]: text[j - k] == key[k], False where j - k < 0.
  shifted = jnp.stack([jnp.roll(text, k) for k in range(max_ngram)])  # [N, L]
  in_text = positions[None, :] >= jnp.arange(max_ngram)[:, None]
  equal = (shifted == key[:, None]) & in_text
  # [N, L]: the n-gram ending at j matches for n = k + 1.
  matches = jnp.cumprod(equal, axis=0).astype(bool) & valid[None, :]
  matches &= (jnp.arange(max_ngram) < key_len)[:, None]
  return jnp.max(jnp.where(matches, positions[None, :], -1), axis=1)


def propose(source, output, end, max_ngram):
  """The lookup's next token for one row, after output[:end].

  Args:
    source: int32 [S] the encoder input, 0 for padding.
    output: int32 [C] BOS then the output; output[:end] is valid.
    end: int32 [] tokens of `output` fed so far (BOS included), >= 1.
    max_ngram: the longest key.

  Returns:
    int32 [] the proposed token.
  """
  # [N]: output[end-1], output[end-2], ...: the key, most recent first.
  key = output[jnp.maximum(end - 1 - jnp.arange(max_ngram), 0)]
  key_len = end - 1  # BOS is not part of any key.
  source_len = jnp.sum(source != decoding.BOS_ID)
  in_output = _last_match(
      output,
      (jnp.arange(output.shape[0]) >= 1)
      & (jnp.arange(output.shape[0]) < end - 1),
      key,
      key_len,
      max_ngram,
  )
  in_source = _last_match(
      source,
      jnp.arange(source.shape[0]) < source_len - 1,
      key,
      key_len,
      max_ngram,
  )
  # The longest n with a match; at equal n the output's (more recent) wins.
  # [N] candidates for n = 1..N, from the output, else the source.
  candidates = jnp.where(
      in_output >= 0,
      output[jnp.maximum(in_output + 1, 0)],
      jnp.where(in_source >= 0, source[jnp.maximum(in_source + 1, 0)], -1),
  )
  found = candidates >= 0
  longest = jnp.max(jnp.where(found, jnp.arange(max_ngram), -1))
  return jnp.where(
      longest >= 0, candidates[jnp.maximum(longest, 0)], inputs_lib.EOS_ID
  )


@flax.struct.dataclass
class PromptLookup:
  """The lookup draft's decode function (see `decoding.DecodeFn`).

  Attributes:
    vocab_size: V, the width of the logits it returns.
    max_ngram: the longest key looked up.
  """

  vocab_size: int = flax.struct.field(pytree_node=False)
  max_ngram: int = flax.struct.field(pytree_node=False, default=3)

  def __call__(self, tokens, cache):
    """Logits [B, T, V] (0 on the proposal, -inf elsewhere) after tokens.

    Args:
      tokens: int32 [B, T] fed at positions lengths..lengths+T-1.
      cache: a LookupCache.

    Returns:
      The logits, and the cache with the tokens written.
    """
    batch_size, num_tokens = tokens.shape
    positions = cache.lengths[:, None] + jnp.arange(num_tokens)  # [B, T]
    rows = jnp.arange(batch_size)[:, None]  # [B, 1]
    output = cache.output.at[rows, positions].set(tokens, mode="drop")
    per_position = jax.vmap(
        jax.vmap(propose, in_axes=(None, None, 0, None)),
        in_axes=(0, 0, 0, None),
    )
    proposals = per_position(
        cache.source, output, positions + 1, self.max_ngram
    )  # [B, T]
    logits = jnp.where(
        jnp.arange(self.vocab_size) == proposals[..., None], 0.0, -jnp.inf
    )  # [B, T, V]
    return logits, cache.replace(
        lengths=cache.lengths + num_tokens, output=output
    )
