"""The T5 model (models/t5.py): cached decoding against one teacher-forced
pass, the t5x parameter tree, float32 logits from bfloat16 weights, and a
compiled decode call that moves no cache."""

import dataclasses
import re

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import small_t5
from spec_decode import compiled_costs
from spec_decode.models import layers
from spec_decode.models import t5

ATOL = small_t5.ATOL
_config = small_t5.config
_jitted_decode = small_t5.jitted_decode


class CachedDecodeTest(parameterized.TestCase):

  def _setup(self, family, batch=3, enc_len=7, dec_len=20, seed=0):
    config = _config(family)
    model = t5.Transformer(config)
    params = t5.init_params(config, jax.random.key(seed))
    rng = np.random.default_rng(seed)
    inputs = rng.integers(2, config.vocab_size, (batch, enc_len))
    for b in range(batch):  # Right padding of different lengths.
      inputs[b, enc_len - b :] = 0
    targets = rng.integers(2, config.vocab_size, (batch, dec_len))
    targets[:, 0] = 0  # Decoding starts from token 0.
    full = model.apply({"params": params}, inputs, targets)
    encoded = model.apply({"params": params}, inputs, method=model.encode)
    return model, params, inputs, targets, full, encoded

  def _cache(self, model, params, encoded, inputs, max_length):
    return model.apply(
        {"params": params}, encoded, inputs, max_length, method=model.init_cache
    )

  def _decode(self, model, params, tokens, cache):
    return _jitted_decode(model)(params, jnp.asarray(tokens), cache)

  @parameterized.parameters("t5_1_1", "t5_1_0")
  def test_prefill_then_single_steps(self, family):
    model, params, inputs, targets, full, encoded = self._setup(family)
    cache = self._cache(model, params, encoded, inputs, 24)
    prefill = 6
    logits, cache = self._decode(model, params, targets[:, :prefill], cache)
    chunks = [logits]
    for t in range(prefill, targets.shape[1]):
      logits, cache = self._decode(model, params, targets[:, t : t + 1], cache)
      chunks.append(logits)
    np.testing.assert_allclose(
        np.concatenate(chunks, axis=1), full, rtol=0, atol=ATOL
    )
    np.testing.assert_array_equal(cache.lengths, targets.shape[1])

  @parameterized.parameters("t5_1_1", "t5_1_0")
  def test_random_chunks_with_different_row_lengths(self, family):
    model, params, inputs, targets, full, encoded = self._setup(
        family, batch=4, dec_len=30
    )
    rng = np.random.default_rng(1)
    max_chunk = 5
    cache = self._cache(model, params, encoded, inputs, 30 + max_chunk)
    lengths = np.zeros(4, np.int64)
    padded = np.pad(targets, ((0, 0), (0, max_chunk)))
    steps = 0
    while lengths.min() < targets.shape[1]:
      size = int(rng.integers(1, max_chunk + 1))
      chunk = np.stack([padded[b, l : l + size] for b, l in enumerate(lengths)])
      cache = cache.replace(lengths=jnp.asarray(lengths, jnp.int32))
      logits, cache = self._decode(model, params, chunk, cache)
      np.testing.assert_array_equal(cache.lengths, lengths + size)
      for b, start in enumerate(lengths):
        valid = min(size, targets.shape[1] - start)
        np.testing.assert_allclose(
            logits[b, :valid],
            full[b, start : start + valid],
            rtol=0,
            atol=ATOL,
            err_msg=f"row {b} from position {start}",
        )
      # Each row keeps its own number of the chunk's tokens and rolls back
      # the rest, so rows drift apart.
      keep = rng.integers(0, size + 1, size=4)
      lengths = np.minimum(lengths + keep, targets.shape[1])
      steps += 1
    self.assertGreater(steps, 8)

  @parameterized.parameters("t5_1_1", "t5_1_0")
  def test_rollback_then_rewrite(self, family):
    model, params, inputs, targets, full, encoded = self._setup(family)
    rng = np.random.default_rng(2)
    cache = self._cache(model, params, encoded, inputs, 24)
    _, cache = self._decode(model, params, targets[:, :8], cache)
    # Write wrong tokens at positions 8..13, then roll back to 8 per row. A
    # cache that accumulated instead of overwriting would keep their trace.
    wrong = rng.integers(2, 97, targets[:, 8:14].shape)
    _, cache = self._decode(model, params, wrong, cache)
    cache = cache.replace(lengths=jnp.full((3,), 8, jnp.int32))
    logits, cache = self._decode(model, params, targets[:, 8:14], cache)
    np.testing.assert_allclose(logits, full[:, 8:14], rtol=0, atol=ATOL)
    # Roll one row further back than the others, and rewrite from there.
    cache = cache.replace(lengths=jnp.asarray([14, 3, 10], jnp.int32))
    chunk = np.stack([targets[0, 14:18], targets[1, 3:7], targets[2, 10:14]])
    logits, cache = self._decode(model, params, chunk, cache)
    expected = np.stack([full[0, 14:18], full[1, 3:7], full[2, 10:14]])
    np.testing.assert_allclose(logits, expected, rtol=0, atol=ATOL)

  def test_positions_beyond_max_distance(self):
    # 150 positions cross the last relative-position bucket (distance 128).
    model, params, inputs, targets, full, encoded = self._setup(
        "t5_1_1", batch=2, dec_len=150
    )
    cache = self._cache(model, params, encoded, inputs, 150)
    logits, cache = self._decode(model, params, targets[:, :137], cache)
    rest, _ = self._decode(model, params, targets[:, 137:], cache)
    np.testing.assert_allclose(
        np.concatenate([logits, rest], axis=1), full, rtol=0, atol=ATOL
    )

  def test_writes_past_capacity_are_dropped(self):
    model, params, inputs, targets, full, encoded = self._setup("t5_1_1")
    cache = self._cache(model, params, encoded, inputs, 8)
    _, cache = self._decode(model, params, targets[:, :6], cache)
    before = np.asarray(cache.keys[0])
    logits, after = self._decode(model, params, targets[:, 6:10], cache)
    np.testing.assert_array_equal(
        np.asarray(after.keys[0])[..., :6], before[..., :6]
    )
    # Positions 6 and 7 fit: they hold what one 8-token write puts there,
    # and their logits are the teacher-forced ones. Tokens 8 and 9 leave no
    # trace (a clipped write would land them on position 7).
    fresh = self._cache(model, params, encoded, inputs, 8)
    _, fresh = self._decode(model, params, targets[:, :8], fresh)
    for layer in range(len(after.keys)):
      for got, want in ((after.keys, fresh.keys), (after.values, fresh.values)):
        np.testing.assert_allclose(
            np.asarray(got[layer]), np.asarray(want[layer]), rtol=0, atol=ATOL
        )
    np.testing.assert_allclose(logits[:, :2], full[:, 6:8], rtol=0, atol=ATOL)


class ParamTreeTest(absltest.TestCase):

  def test_t5x_names_and_logical_axes(self):
    config = _config("t5_1_1")
    axes = t5.param_logical_axes(config)
    layer = axes["decoder"]["layers_0"]
    self.assertEqual(
        tuple(layer["self_attention"]["query"]["kernel"]),
        ("embed", "joined_kv"),
    )
    self.assertEqual(
        tuple(layer["encoder_decoder_attention"]["out"]["kernel"]),
        ("joined_kv", "embed"),
    )
    self.assertEqual(tuple(layer["mlp"]["wi_0"]["kernel"]), ("embed", "mlp"))
    self.assertEqual(
        tuple(axes["decoder"]["relpos_bias"]["rel_embedding"]),
        ("heads", "relpos_buckets"),
    )
    self.assertEqual(
        tuple(axes["token_embedder"]["embedding"]), ("vocab", "embed")
    )
    self.assertEqual(
        tuple(axes["decoder"]["logits_dense"]["kernel"]), ("embed", "vocab")
    )
    shapes = t5.param_shapes(config)
    self.assertEqual(
        shapes["encoder"]["layers_1"]["attention"]["query"]["kernel"].shape,
        (16, 32),
    )

  def test_t5_1_0_has_no_logits_dense_and_one_wi(self):
    shapes = t5.param_shapes(_config("t5_1_0"))
    self.assertNotIn("logits_dense", shapes["decoder"])
    self.assertEqual(set(shapes["encoder"]["layers_0"]["mlp"]), {"wi", "wo"})

  def test_trees_are_traced_once_a_config_and_are_callers_own(self):
    config = dataclasses.replace(_config("t5_1_1"), emb_dim=24)
    misses = t5._abstract_variables.cache_info().misses
    shapes = t5.param_shapes(config)
    axes = t5.param_logical_axes(config)
    self.assertEqual(t5._abstract_variables.cache_info().misses, misses + 1)
    # A caller that changes its tree changes no other caller's.
    del shapes["encoder"]
    axes["decoder"]["logits_dense"]["kernel"] = None
    self.assertIn("encoder", t5.param_shapes(config))
    self.assertEqual(
        tuple(
            t5.param_logical_axes(config)["decoder"]["logits_dense"]["kernel"]
        ),
        ("embed", "vocab"),
    )
    self.assertEqual(t5._abstract_variables.cache_info().misses, misses + 1)


class LogitsDtypeTest(parameterized.TestCase):
  """Float32 logits from bfloat16 weights, with no float32 copy of them."""

  def test_widening_dot_accumulates_exact_products_in_float32(self):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(3, 64)), jnp.bfloat16)
    kernel = jnp.asarray(rng.normal(size=(64, 97)), jnp.bfloat16)
    want = np.asarray(x, np.float64) @ np.asarray(kernel, np.float64)
    got = layers.widening_dot(x, kernel, jnp.float32)
    self.assertEqual(got.dtype, jnp.float32)
    # Exact products summed in float32: far below one bfloat16 rounding.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    # A float32 input keeps its precision: the bfloat16 kernel widens.
    x32 = jnp.asarray(rng.normal(size=(3, 64)), jnp.float32)
    want32 = np.asarray(x32, np.float64) @ np.asarray(kernel, np.float64)
    got32 = layers.widening_dot(x32, kernel, jnp.float32)
    np.testing.assert_allclose(got32, want32, rtol=0, atol=1e-4)

  @parameterized.parameters("t5_1_1", "t5_1_0")
  def test_bfloat16_decode_copies_no_logits_weights_to_float32(self, family):
    config = dataclasses.replace(_config(family), dtype="bfloat16")
    model = t5.Transformer(config)
    params = jax.tree.map(
        lambda a: a.astype(jnp.bfloat16),
        t5.init_params(config, jax.random.key(0)),
    )
    inputs = jnp.ones((2, 5), jnp.int32)
    encoded = model.apply({"params": params}, inputs, method=model.encode)
    cache = model.apply(
        {"params": params}, encoded, inputs, 8, method=model.init_cache
    )
    tokens = jnp.zeros((2, 3), jnp.int32)
    logits, _ = _jitted_decode(model)(params, tokens, cache)
    self.assertEqual(logits.dtype, jnp.float32)
    text = _jitted_decode(model).lower(params, tokens, cache).as_text()
    widened = [
        line
        for line in text.splitlines()
        if "stablehlo.convert" in line
        and re.search(r"tensor<(16x97|97x16)xbf16>", line)
    ]
    self.assertEqual(widened, [])


class CacheLayoutTest(parameterized.TestCase):
  """Attention reads the cache as laid out: no copy or transpose of it."""

  @parameterized.product(
      dtype=("float32", "bfloat16"), batch=(1, 4), num_tokens=(1, 5)
  )
  def test_compiled_decode_moves_no_cache(self, dtype, batch, num_tokens):
    # Heads as wide as a real model's relative to T, so that one layer's
    # keys outweigh the [B, H, T, L] float32 attention scores.
    config = dataclasses.replace(_config("t5_1_1"), head_dim=32, dtype=dtype)
    costs = compiled_costs.call_costs(
        config,
        batch_size=batch,
        num_tokens=num_tokens,
        input_len=16,
        capacity=64,
        filled=20,
    )
    self.assertEqual(costs.cache_moves, ())


if __name__ == "__main__":
  absltest.main()
