"""Decode loops over bucketed key bounds (`spec_decode/key_buckets.py`)."""

import dataclasses
import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import fake_models
from spec_decode import decoding
from spec_decode import drafts
from spec_decode import key_buckets
from spec_decode import sampling
from spec_decode import speculative
from spec_decode.models import t5

ATOL = 1e-5
SAMPLED = sampling.SamplingConfig(temperature=1.0)
# No row stops early: EOS is a token the loops never meet.
NO_EOS = -1
MAX_DECODE_LEN = 24


def _config(**overrides):
  return dataclasses.replace(fake_models.tiny_t5(97), **overrides)


class BoundsTest(parameterized.TestCase):

  @parameterized.parameters(
      (264, 4, (72, 136, 200, 264)),
      (24, 4, (8, 16, 24)),
      (35, 4, (16, 24, 32, 35)),
      (45, 2, (24, 45)),
      (264, 1, (264,)),
      (5, 4, (5,)),
  )
  def test_capacity_steps_rounded_to_8(self, capacity, count, expected):
    self.assertEqual(key_buckets.bounds(capacity, count), expected)

  def _cache(self, batch_size, buckets):
    config = _config(attention_buckets=buckets)
    model = t5.Transformer(config)
    params = t5.param_shapes(config)
    inputs = jax.ShapeDtypeStruct((batch_size, 7), jnp.int32)
    return jax.eval_shape(
        lambda p, x: drafts.t5_cache(model, p, x, 264), params, inputs
    )

  def test_bound_for_is_the_smallest_that_holds_the_keys(self):
    cache = self._cache(2, 4)
    self.assertEqual(key_buckets.cache_bounds(cache), (72, 136, 200, 264))
    self.assertEqual(key_buckets.bound_for(cache, 129), 136)
    self.assertEqual(key_buckets.bound_for(cache, 136), 136)
    self.assertEqual(key_buckets.bound_for(cache, 137), 200)
    self.assertEqual(key_buckets.bound_for(cache, 300), 264)

  def test_batch_1_buckets_and_one_bucket_reads_the_whole_capacity(self):
    self.assertEqual(
        key_buckets.cache_bounds(self._cache(1, 4)), (72, 136, 200, 264)
    )
    cache = self._cache(2, 1)
    self.assertEqual(key_buckets.cache_bounds(cache), (264,))
    self.assertEqual(key_buckets.bound_for(cache, 9), 264)


class ResizedTest(absltest.TestCase):

  def test_call_on_a_cut_cache_matches_the_whole_capacity(self):
    config = _config()
    model = t5.Transformer(config)
    params = t5.init_params(config, jax.random.key(0))
    rng = np.random.default_rng(0)
    inputs = rng.integers(2, 97, (3, 7))
    tokens = jnp.asarray(rng.integers(2, 97, (3, 4)))
    cache = drafts.t5_cache(model, params, inputs, 48)
    cache = cache.replace(lengths=jnp.asarray([3, 12, 20], jnp.int32))
    decode = jax.jit(t5.make_decode_fn(model, params).__call__)
    whole, whole_cache = decode(tokens, cache)
    # The longest row's last query sits at 23: 24 positions hold it.
    cut, cut_cache = decode(tokens, key_buckets.resized(cache, 24))
    np.testing.assert_allclose(cut, whole, rtol=0, atol=ATOL)
    self.assertEqual(cut_cache.max_length, 24)
    for mine, theirs in zip(cut_cache.keys, whole_cache.keys):
      np.testing.assert_array_equal(mine, theirs[..., :24])
    for mine, theirs in zip(cut_cache.values, whole_cache.values):
      np.testing.assert_array_equal(mine, theirs[:, :, :24])
    # Padded back to the capacity, the written positions are all there.
    grown = key_buckets.resized(cut_cache, 48)
    self.assertEqual(grown.max_length, 48)
    for mine, theirs in zip(grown.values, whole_cache.values):
      np.testing.assert_array_equal(mine[:, :, :24], theirs[:, :, :24])
      np.testing.assert_array_equal(mine[:, :, 24:], 0)
    # 23 positions drop that query's own key, and change its logits.
    short, _ = decode(tokens, key_buckets.resized(cache, 23))
    self.assertGreater(float(jnp.max(jnp.abs(short[2, 3] - whole[2, 3]))), 1e-3)
    np.testing.assert_allclose(short[:, :3], whole[:, :3], rtol=0, atol=ATOL)


class _Recorder:
  """A decode function that records, per call in order, the positions of
  the cache it is given and the keys its longest row needs (through a host
  callback)."""

  def __init__(self, decode_fn):
    self.decode_fn = decode_fn
    self.calls = []  # (cache positions, keys needed)

  def _record(self, limit, needed):
    self.calls.append((limit, int(needed)))

  def __call__(self, tokens, cache):
    jax.debug.callback(
        functools.partial(self._record, cache.max_length),
        jnp.max(cache.lengths) + tokens.shape[1],
        ordered=True,
    )
    return self.decode_fn(tokens, cache)


class LoopTest(parameterized.TestCase):
  """A bucketed loop emits what the unbucketed one does, in float32."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.inputs = np.random.default_rng(0).integers(2, 97, (3, 7))

  def _pair(self, buckets, capacity):
    config = _config(attention_buckets=buckets)
    draft_config = _config(
        attention_buckets=buckets,
        emb_dim=8,
        head_dim=4,
        num_encoder_layers=0,
        shared_encoder_dim=16,
    )
    target_model = t5.Transformer(config)
    draft_model = t5.Transformer(draft_config)
    target_params = t5.init_params(config, jax.random.key(0))
    draft_params = t5.init_params(draft_config, jax.random.key(1))
    target_cache, draft_cache = drafts.shared_encoder_caches(
        target_model,
        target_params,
        draft_model,
        draft_params,
        self.inputs,
        capacity,
    )
    return (
        t5.make_decode_fn(target_model, target_params),
        t5.make_decode_fn(draft_model, draft_params),
        target_cache,
        draft_cache,
    )

  def _speculative(self, buckets, gamma, config, wrap=lambda fn: fn):
    target_fn, draft_fn, target_cache, draft_cache = self._pair(
        buckets, MAX_DECODE_LEN + gamma + 1
    )
    return speculative.speculative_decode(
        wrap(target_fn),
        wrap(draft_fn),
        target_cache,
        draft_cache,
        jax.random.key(3),
        gamma=gamma,
        max_decode_len=MAX_DECODE_LEN,
        eos_id=NO_EOS,
        config=config,
        return_caches=True,
    )

  def _baseline(self, buckets, config):
    target_fn, _, target_cache, _ = self._pair(buckets, MAX_DECODE_LEN)
    return decoding.autoregressive_decode(
        target_fn,
        target_cache,
        jax.random.key(3),
        max_decode_len=MAX_DECODE_LEN,
        eos_id=NO_EOS,
        config=config,
        return_cache=True,
    )

  def test_speculative_matches_unbucketed_each_call_within_its_bound(self):
    gamma = 3
    recorders = []

    def wrap(fn):
      recorders.append(_Recorder(fn))
      return recorders[-1]

    whole, whole_target, _ = self._speculative(1, gamma, SAMPLED)
    bucketed, bucketed_target, _ = self._speculative(4, gamma, SAMPLED, wrap)
    jax.effects_barrier()
    np.testing.assert_array_equal(bucketed.sequences, whole.sequences)
    np.testing.assert_array_equal(bucketed.target_calls, whole.target_calls)
    self.assertEqual(bucketed_target.max_length, MAX_DECODE_LEN + gamma + 1)
    self.assertEqual(bucketed_target.key_buckets, 4)
    for mine, theirs in zip(bucketed_target.values, whole_target.values):
      np.testing.assert_allclose(mine, theirs, rtol=0, atol=ATOL)
    target, draft = recorders
    bounds = key_buckets.bounds(MAX_DECODE_LEN + gamma + 1, 4)
    for recorder in (target, draft):
      for limit, needed in recorder.calls:
        self.assertLessEqual(needed, limit)
      self.assertEqual(sorted({c[0] for c in recorder.calls}), list(bounds))
    # The loop moves to the next bound only once the target's next call
    # would not fit under the current one.
    limits = [limit for limit, _ in target.calls]
    for i in range(1, len(limits)):
      if limits[i] != limits[i - 1]:
        self.assertGreater(target.calls[i][1], limits[i - 1])

  def test_baseline_matches_unbucketed(self):
    whole, _ = self._baseline(1, SAMPLED)
    bucketed, cache = self._baseline(4, SAMPLED)
    np.testing.assert_array_equal(bucketed.sequences, whole.sequences)
    self.assertEqual(cache.max_length, MAX_DECODE_LEN)


if __name__ == "__main__":
  absltest.main()
