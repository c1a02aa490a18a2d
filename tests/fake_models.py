"""Fake autoregressive models that drive the decoding loops in tests.

A fake model's logits after a prefix are a row of a random table, picked by a
hash of the whole prefix (context, BOS, y_1, ..., y_t). The cache stores the
hash of every prefix at its position, so a row's logits depend on exactly the
tokens at positions below its length: a rollback that forgets to shorten, a
catch-up that skips a token, or a write at the wrong offset changes the logits.
"""

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import drafts
from spec_decode.models import decode_cache
from spec_decode.models import t5
from spec_decode.models.config import T5Config


def tiny_t5(vocab_size: int) -> T5Config:
  """The smallest T5 with every part: one layer each side, width 16."""
  return T5Config(
      vocab_size=vocab_size,
      emb_dim=16,
      num_heads=2,
      head_dim=8,
      mlp_dim=32,
      num_encoder_layers=1,
      num_decoder_layers=1,
  )


def abstract_t5_cache(capacity: int) -> decode_cache.DecodeCache:
  """The shapes of a tiny T5's cache of `capacity` positions, for one row
  of 4 input tokens; nothing is computed."""
  config = tiny_t5(32)
  make = functools.partial(
      drafts.t5_cache, t5.Transformer(config), max_length=capacity
  )
  inputs = jax.ShapeDtypeStruct((1, 4), jnp.int32)
  return jax.eval_shape(make, t5.param_shapes(config), inputs)


# Rows of the logits table: more than the prefixes a test visits, so that most
# prefixes get their own row.
_TABLE_ROWS = 4096


def _mix(hashes: jax.Array) -> jax.Array:
  """A bijective avalanche on uint32 (MurmurHash3's finalizer)."""
  hashes = hashes ^ (hashes >> 16)
  hashes = hashes * jnp.uint32(0x85EBCA6B)
  hashes = hashes ^ (hashes >> 13)
  hashes = hashes * jnp.uint32(0xC2B2AE35)
  return hashes ^ (hashes >> 16)


@flax.struct.dataclass
class FakeCache:
  """A fake decoder cache.

  Attributes:
    prefix_hashes: uint32 [B, capacity] hash of the prefix ending at each
      position.
    contexts: uint32 [B] a per-row seed, standing in for the encoder input.
    lengths: int32 [B] positions written per row.
  """

  prefix_hashes: jax.Array
  contexts: jax.Array
  lengths: jax.Array


@flax.struct.dataclass
class FakeModel:
  """A decode function whose logits are a deterministic function of the prefix.

  Attributes:
    table: [rows, V] logits, one row per prefix hash bucket.
  """

  table: jax.Array

  @property
  def vocab_size(self) -> int:
    return self.table.shape[1]

  def init_cache(self, contexts, capacity: int) -> FakeCache:
    contexts = jnp.asarray(contexts, jnp.uint32)
    batch_size = contexts.shape[0]
    return FakeCache(
        prefix_hashes=jnp.zeros((batch_size, capacity), jnp.uint32),
        contexts=contexts,
        lengths=jnp.zeros((batch_size,), jnp.int32),
    )

  def __call__(self, tokens: jax.Array, cache: FakeCache):
    """Appends tokens [B, T]; returns logits [B, T, V] and the cache."""
    previous = jnp.take_along_axis(
        cache.prefix_hashes, jnp.maximum(cache.lengths - 1, 0)[:, None], axis=1
    )[:, 0]
    previous = jnp.where(cache.lengths > 0, previous, _mix(cache.contexts))

    def extend(hashes, token):
      hashes = _mix(hashes * jnp.uint32(1000003) + token.astype(jnp.uint32))
      return hashes, hashes

    _, new_hashes = jax.lax.scan(extend, previous, tokens.T)  # [T, B]
    new_hashes = new_hashes.T  # [B, T]
    prefix_hashes = jax.vmap(
        lambda row, new, start: jax.lax.dynamic_update_slice(row, new, (start,))
    )(cache.prefix_hashes, new_hashes, cache.lengths)
    logits = self.table[new_hashes % _TABLE_ROWS]  # [B, T, V]
    return logits, cache.replace(
        prefix_hashes=prefix_hashes, lengths=cache.lengths + tokens.shape[1]
    )


def random_model(
    seed: int,
    vocab_size: int,
    *,
    scale: float = 2.0,
    eos_id: int = 1,
    eos_bias: float = 0.0,
    dtype=jnp.float32,
) -> FakeModel:
  """A fake model with N(0, scale^2) logits, plus eos_bias on EOS.

  eos_bias=-inf gives a model that never emits EOS.
  """
  table = scale * jax.random.normal(
      jax.random.key(seed), (_TABLE_ROWS, vocab_size), jnp.float32
  )
  table = table.at[:, eos_id].add(eos_bias)
  return FakeModel(table=table.astype(dtype))


def perturbed(model: FakeModel, seed: int, noise: float) -> FakeModel:
  """A draft for `model`: its logits plus N(0, noise^2) noise."""
  table = model.table.astype(jnp.float32)
  table = table + noise * jax.random.normal(jax.random.key(seed), table.shape)
  return FakeModel(table=table.astype(model.table.dtype))


def contrary(model: FakeModel) -> FakeModel:
  """A draft whose argmax is the target's argmin: greedily it never agrees."""
  return FakeModel(table=-model.table)


@dataclasses.dataclass
class CallCounter:
  """Counts a fake model's calls and checks its writes (use under disable_jit).

  Attributes:
    decode_fn: The fake model.
    calls: Calls so far.
    max_end: The largest position written plus one, over all rows and calls.
  """

  decode_fn: FakeModel
  calls: int = 0
  max_end: int = 0

  def __call__(self, tokens, cache):
    self.calls += 1
    self.max_end = max(self.max_end, int(cache.lengths.max()) + tokens.shape[1])
    if self.max_end > cache.prefix_hashes.shape[1]:
      raise IndexError(f"Write past the cache's capacity at {self.max_end}.")
    return self.decode_fn(tokens, cache)


def context_ids(batch_size: int, seed: int = 0) -> np.ndarray:
  """Distinct per-row contexts, so that rows decode different sequences."""
  return np.random.default_rng(seed).integers(0, 2**31, size=batch_size)
