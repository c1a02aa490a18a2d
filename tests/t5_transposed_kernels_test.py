"""T5Config.transposed_kernels and few_rows_kernel: the same T5 with its
kernels stored [out, in] (t5.transpose_kernels), and its few-row decode
products in the few-rows kernel."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import small_t5
from spec_decode.models import t5

ATOL = small_t5.ATOL
_config = small_t5.config
_jitted_decode = small_t5.jitted_decode


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


def _decode_twice(config, params, seed):
  """A 1-token then a 3-token cached decode call of 2 rows.

  Returns:
    Their logits [2, 4, V], the jitted decode, and its arguments for the
    3-token call on the fresh cache (to trace or lower it).
  """
  rng = np.random.default_rng(seed)
  inputs = jnp.asarray(rng.integers(2, 97, (2, 7)))
  targets = jnp.asarray(rng.integers(2, 97, (2, 4)))
  model = t5.Transformer(config)
  encoded = model.apply({"params": params}, inputs, method=model.encode)
  cache = model.apply(
      {"params": params}, encoded, inputs, 12, method=model.init_cache
  )
  decode = _jitted_decode(model)
  step, after = decode(params, targets[:, :1], cache)
  rest, _ = decode(params, targets[:, 1:], after)
  logits = np.concatenate([step, rest], axis=1)
  return logits, decode, (params, targets[:, 1:], cache)


class PerQueryAttentionTest(absltest.TestCase):
  """T5Config.per_query_attention: the decoder's attention query by query."""

  def test_not_a_bool_raises(self):
    with self.assertRaisesRegex(ValueError, "per_query_attention must be True"):
      dataclasses.replace(_config("t5_1_1"), per_query_attention="yes")

  def test_decode_calls_attend_query_by_query(self):
    config = _config("t5_1_1")
    per_query = dataclasses.replace(config, per_query_attention=True)
    params = t5.init_params(config, jax.random.key(2))
    logits, dots = {}, {}
    for name, cfg in (("batched", config), ("per_query", per_query)):
      logits[name], decode, args = _decode_twice(cfg, params, 2)
      dots[name] = str(jax.make_jaxpr(decode)(*args)).count("dot_general")
    np.testing.assert_allclose(
        logits["per_query"], logits["batched"], atol=ATOL, rtol=0
    )
    # 3 layers x 2 attentions x 2 dots, once for each of the call's 3
    # queries instead of once in all.
    self.assertEqual(dots["per_query"] - dots["batched"], 3 * 2 * 2 * (3 - 1))


class AttentionKernelTest(absltest.TestCase):
  """T5Config.attention_kernel: the decoder's attention in the CPU kernel."""

  def test_not_a_bool_raises(self):
    with self.assertRaisesRegex(ValueError, "attention_kernel must be True"):
      dataclasses.replace(_config("t5_1_1"), attention_kernel=1)

  def test_decode_calls_attend_in_the_kernel(self):
    config = _config("t5_1_1")
    kernel = dataclasses.replace(config, attention_kernel=True)
    params = t5.init_params(config, jax.random.key(3))
    logits = {}
    for name, cfg in (("xla", config), ("kernel", kernel)):
      logits[name], decode, args = _decode_twice(cfg, params, 3)
      hlo = decode.lower(*args).as_text()
      # 3 layers x (self- and cross-attention) in the kernel, or none.
      self.assertEqual(
          hlo.count("custom_call @spec_decode_few_queries_attention("),
          3 * 2 if name == "kernel" else 0,
      )
    np.testing.assert_allclose(
        logits["kernel"], logits["xla"], atol=ATOL, rtol=0
    )


if __name__ == "__main__":
  absltest.main()
