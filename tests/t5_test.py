"""The T5 model: cached decoding against one teacher-forced pass, and both
against transformers' PyTorch T5, in float32."""

import dataclasses
import functools
import re

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import compiled_costs
from spec_decode.models import layers
from spec_decode.models import t5

# Cached and full passes sum the same terms in a different order.
ATOL = 1e-5
# Against transformers' PyTorch T5, in float32 (as in hf_parity_test).
TORCH_ATOL = 1e-4


def _config(family):
  if family == "t5_1_1":
    return t5.T5Config(
        vocab_size=97,
        emb_dim=16,
        num_heads=4,
        head_dim=8,
        mlp_dim=32,
        num_encoder_layers=2,
        num_decoder_layers=3,
    )
  return t5.T5Config(
      vocab_size=97,
      emb_dim=16,
      num_heads=4,
      head_dim=8,
      mlp_dim=32,
      num_encoder_layers=2,
      num_decoder_layers=3,
      mlp_activations=("relu",),
      logits_via_embedding=True,
  )


@functools.cache
def _jitted_decode(model):
  return jax.jit(
      lambda params, tokens, cache: model.apply(
          {"params": params}, tokens, cache, method=model.decode
      )
  )


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


def _shared_config(**overrides):
  """A shared-encoder draft for _config("t5_1_1") (encoder width 16)."""
  fields = dict(
      vocab_size=97,
      emb_dim=8,
      num_heads=2,
      head_dim=4,
      mlp_dim=16,
      num_encoder_layers=0,
      num_decoder_layers=2,
      shared_encoder_dim=16,
  )
  return t5.T5Config(**(fields | overrides))


class TransposedKernelsTest(parameterized.TestCase):
  """T5Config.transposed_kernels: the same model, kernels stored [out, in]."""

  @parameterized.parameters("t5_1_1", "t5_1_0")
  def test_same_logits_from_transposed_kernels(self, family):
    config = _config(family)
    transposed = dataclasses.replace(config, transposed_kernels=True)
    params = t5.init_params(config, jax.random.key(0))
    moved = t5.transpose_kernels(params)
    self.assertEqual(
        jax.tree.map(lambda x: x.shape, moved),
        jax.tree.map(lambda x: x.shape, t5.param_shapes(transposed)),
    )
    self.assertEqual(
        jax.tree.map(lambda x: x.T.shape, params["decoder"]["layers_0"]),
        jax.tree.map(lambda x: x.shape, moved["decoder"]["layers_0"]),
    )
    rng = np.random.default_rng(0)
    inputs = rng.integers(2, 97, (2, 7))
    targets = rng.integers(2, 97, (2, 9))
    expected = t5.Transformer(config).apply({"params": params}, inputs, targets)
    got = t5.Transformer(transposed).apply({"params": moved}, inputs, targets)
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)
    # Decoding 3 tokens at once, from a cache, as a verify call does.
    model = t5.Transformer(transposed)
    encoded = model.apply({"params": moved}, inputs, method=model.encode)
    cache = model.apply(
        {"params": moved}, encoded, inputs, 12, method=model.init_cache
    )
    logits, _ = _jitted_decode(model)(moved, jnp.asarray(targets[:, :3]), cache)
    np.testing.assert_allclose(logits, expected[:, :3], atol=ATOL, rtol=0)

  def test_axes_reverse_and_the_map_is_its_own_inverse(self):
    config = dataclasses.replace(_config("t5_1_1"), transposed_kernels=True)
    axes = t5.param_logical_axes(config)["decoder"]["layers_0"]["mlp"]
    self.assertEqual(tuple(axes["wi_0"]["kernel"]), ("mlp", "embed"))
    self.assertEqual(tuple(axes["wo"]["kernel"]), ("embed", "mlp"))
    params = t5.init_params(_config("t5_1_1"), jax.random.key(0))
    jax.tree.map(
        np.testing.assert_array_equal,
        t5.transpose_kernels(t5.transpose_kernels(params)),
        params,
    )
    # A transposed model draws the same weights, transposed.
    jax.tree.map(
        np.testing.assert_array_equal,
        t5.init_params(config, jax.random.key(0)),
        t5.transpose_kernels(params),
    )

  def test_not_a_bool_raises(self):
    with self.assertRaisesRegex(ValueError, "transposed_kernels must be True"):
      dataclasses.replace(_config("t5_1_1"), transposed_kernels="yes")
    with self.assertRaisesRegex(ValueError, "few_rows_kernel must be True"):
      dataclasses.replace(
          _config("t5_1_1"), transposed_kernels=True, few_rows_kernel=1
      )

  def test_few_rows_kernel_needs_transposed_kernels(self):
    with self.assertRaisesRegex(
        ValueError, "needs T5Config.transposed_kernels"
    ):
      dataclasses.replace(_config("t5_1_1"), few_rows_kernel=True)

  @parameterized.parameters("t5_1_1", "t5_1_0")
  def test_same_decode_logits_from_the_few_rows_kernel(self, family):
    # 1..3-token cached decode calls of 2 rows (2..6 rows a product) run in
    # the kernel; the logits match t5x's layout to float32 rounding.
    config = _config(family)
    kernel_config = dataclasses.replace(
        config, transposed_kernels=True, few_rows_kernel=True
    )
    params = t5.init_params(config, jax.random.key(1))
    moved = t5.transpose_kernels(params)
    rng = np.random.default_rng(1)
    inputs = jnp.asarray(rng.integers(2, 97, (2, 7)))
    targets = jnp.asarray(rng.integers(2, 97, (2, 6)))
    logits = {}
    for name, cfg, p in (
        ("t5x", config, params),
        ("few", kernel_config, moved),
    ):
      model = t5.Transformer(cfg)
      encoded = model.apply({"params": p}, inputs, method=model.encode)
      cache = model.apply(
          {"params": p}, encoded, inputs, 12, method=model.init_cache
      )
      decode = _jitted_decode(model)
      if name == "few":
        hlo = decode.lower(p, targets[:, :3], cache).as_text()
        self.assertIn("spec_decode_few_rows_product", hlo)
      step, cache = decode(p, targets[:, :1], cache)
      rest, _ = decode(p, targets[:, 1:4], cache)
      logits[name] = np.concatenate([step, rest], axis=1)
    np.testing.assert_allclose(logits["few"], logits["t5x"], atol=ATOL, rtol=0)


class SharedEncoderTest(absltest.TestCase):
  """A draft that cross-attends to its target's encoder output."""

  def setUp(self):
    super().setUp()
    target_config = _config("t5_1_1")
    self.target = t5.Transformer(target_config)
    self.target_params = t5.init_params(target_config, jax.random.key(0))
    self.config = _shared_config()
    self.model = t5.Transformer(self.config)
    self.params = t5.init_params(self.config, jax.random.key(1))
    rng = np.random.default_rng(0)
    self.inputs = rng.integers(2, 97, (3, 7))
    self.inputs[1, 4:] = 0
    self.targets = rng.integers(2, 97, (3, 12))
    self.targets[:, 0] = 0

  def _target_encoded(self, inputs):
    return self.target.apply(
        {"params": self.target_params}, inputs, method=t5.Transformer.encode
    )

  def test_params_have_a_projection_and_no_encoder(self):
    shapes = t5.param_shapes(self.config)
    self.assertNotIn("encoder", shapes)
    self.assertEqual(shapes["encoder_projection"]["kernel"].shape, (16, 8))
    self.assertEqual(
        t5.num_params(self.config),
        sum(x.size for x in jax.tree.leaves(self.params)),
    )

  def test_cached_decode_matches_teacher_forced(self):
    target_encoded = self._target_encoded(self.inputs)
    full = self.model.apply(
        {"params": self.params},
        self.inputs,
        self.targets,
        target_encoded=target_encoded,
    )
    encoded = self.model.apply(
        {"params": self.params},
        self.inputs,
        target_encoded=target_encoded,
        method=t5.Transformer.encode,
    )  # [B, S, 8]
    self.assertEqual(encoded.shape, (3, 7, 8))
    cache = self.model.apply(
        {"params": self.params},
        encoded,
        self.inputs,
        16,
        method=t5.Transformer.init_cache,
    )
    chunks = []
    for start, stop in ((0, 5), (5, 6), (6, 12)):
      logits, cache = _jitted_decode(self.model)(
          self.params, jnp.asarray(self.targets[:, start:stop]), cache
      )
      chunks.append(logits)
    np.testing.assert_allclose(
        np.concatenate(chunks, axis=1), full, rtol=0, atol=ATOL
    )

  def test_logits_follow_the_target_encoding(self):
    """Another input changes only the encoding, and so the logits."""
    other = self.inputs.copy()
    other[:, 1] = (other[:, 1] + 1) % 95 + 2
    logits = [
        self.model.apply(
            {"params": self.params},
            inputs,
            self.targets,
            target_encoded=self._target_encoded(inputs),
        )
        for inputs in (self.inputs, other)
    ]
    self.assertGreater(float(jnp.max(jnp.abs(logits[0] - logits[1]))), 1e-3)

  def test_missing_or_stray_encoding_raises(self):
    with self.assertRaisesRegex(ValueError, "needs its target's encoder"):
      self.model.apply({"params": self.params}, self.inputs, self.targets)
    with self.assertRaisesRegex(ValueError, "for a shared-encoder draft only"):
      self.target.apply(
          {"params": self.target_params},
          self.inputs,
          self.targets,
          target_encoded=self._target_encoded(self.inputs),
      )

  def test_invalid_configs_raise(self):
    with self.assertRaisesRegex(
        ValueError, r"^T5Config.num_encoder_layers must be 0 for a shared"
    ):
      _shared_config(num_encoder_layers=1)
    with self.assertRaisesRegex(
        ValueError, r"^T5Config.shared_encoder_dim must be >= 0, got -1"
    ):
      _shared_config(shared_encoder_dim=-1)
    with self.assertRaisesRegex(
        ValueError, r"^T5Config.num_encoder_layers must be >= 1, got 0"
    ):
      _shared_config(shared_encoder_dim=0)


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


class TorchReferenceTest(parameterized.TestCase):
  """The model itself against an independent one: transformers' PyTorch T5.

  The other tests here hold the cache to the module's own teacher-forced
  pass, which a bug in the module shares. Here the same parameters go into
  transformers' T5 through `hf_reference.model_from_params` (not through our
  checkpoint loader), and both the teacher-forced pass and the cached path
  (a prefill, then a chunk, then single steps) must give its logits.
  """

  @parameterized.parameters("t5_1_1", "t5_1_0")
  def test_logits_match_transformers(self, family):
    import hf_reference  # pylint: disable=g-import-not-at-top

    config = _config(family)
    model = t5.Transformer(config)
    params = jax.device_get(t5.init_params(config, jax.random.key(3)))
    rng = np.random.default_rng(3)
    inputs = rng.integers(2, config.vocab_size, (3, 24))
    inputs[1, 15:] = 0  # Padded rows.
    inputs[2, 5:] = 0
    targets = rng.integers(2, config.vocab_size, (3, 20))
    targets[:, 0] = 0
    expected = hf_reference.logits(config, params, inputs, targets)
    self.assertGreater(np.abs(expected).max(), 1.0)
    full = model.apply({"params": params}, inputs, targets)
    np.testing.assert_allclose(full, expected, rtol=0, atol=TORCH_ATOL)

    encoded = model.apply({"params": params}, inputs, method=model.encode)
    cache = model.apply(
        {"params": params}, encoded, inputs, 20, method=model.init_cache
    )
    chunks = []
    for start, stop in [(0, 6), (6, 10)] + [(t, t + 1) for t in range(10, 20)]:
      logits, cache = _jitted_decode(model)(
          params, jnp.asarray(targets[:, start:stop]), cache
      )
      chunks.append(logits)
    np.testing.assert_allclose(
        np.concatenate(chunks, axis=1), expected, rtol=0, atol=TORCH_ATOL
    )


if __name__ == "__main__":
  absltest.main()
