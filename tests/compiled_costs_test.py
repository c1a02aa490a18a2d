"""compiled_costs: the bytes a decode call must read, and what XLA reports.

The needed bytes are counted here again from the config's dimensions by hand,
so that a parameter wrongly counted on (or off) the decode path shows.
"""

import dataclasses

from absl.testing import absltest
import gin
import jax
import jax.numpy as jnp

from spec_decode import compiled_costs
from spec_decode import drafts
from spec_decode import gin_config
from spec_decode.models import t5


def _tiny(dtype="float32"):
  gin_config.parse(["models/t5_1_1_tiny.gin"], [f"T5Config.dtype = '{dtype}'"])
  return t5.T5Config()


class GinTestCase(absltest.TestCase):
  """Leaves gin clear (and unlocked) for the next test in the process."""

  def tearDown(self):
    gin.clear_config()
    super().tearDown()


class NeededBytesTest(GinTestCase):

  def test_decode_path_params_counted_by_hand(self):
    config = _tiny("bfloat16")
    params = compiled_costs._abstract_params(config)
    width = config.num_heads * config.head_dim
    emb = config.emb_dim
    per_layer = (
        4 * emb * width  # self-attention q, k, v, out
        + 2 * emb * width  # cross-attention q, out (k, v live in the cache)
        + len(config.mlp_activations) * emb * config.mlp_dim  # wi
        + config.mlp_dim * emb  # wo
        + 3 * emb  # three layer norms
    )
    lookups = 5
    expected = (
        config.num_decoder_layers * per_layer
        + emb  # decoder_norm
        + config.num_heads * config.num_buckets  # relpos_bias
        + emb * config.vocab_size  # logits_dense
        + lookups * emb  # embedding rows looked up
    ) * 2
    self.assertEqual(
        compiled_costs.decode_path_param_bytes(config, params, lookups),
        expected,
    )

  def test_tied_logits_read_the_whole_embedding(self):
    config = _tiny()
    tied = dataclasses.replace(config, logits_via_embedding=True)
    params = compiled_costs._abstract_params(tied)
    emb = tied.emb_dim
    untied_params = compiled_costs._abstract_params(config)
    untied = compiled_costs.decode_path_param_bytes(config, untied_params, 3)
    # Tied: no logits_dense, and the whole embedding instead of 3 rows.
    self.assertEqual(
        compiled_costs.decode_path_param_bytes(tied, params, 3),
        untied - 3 * emb * 4,
    )

  def test_cache_bytes(self):
    config = _tiny()
    batch, input_len, capacity, filled = 3, 7, 20, 9
    model = t5.Transformer(config)
    cache = jax.eval_shape(
        lambda p, x: drafts.t5_cache(model, p, x, capacity),
        compiled_costs._abstract_params(config),
        jax.ShapeDtypeStruct((batch, input_len), jnp.int32),
    )
    kv = config.num_heads * config.head_dim * 4  # float32 bytes per position
    layers = config.num_decoder_layers
    keys = 8  # 7 input positions hold 8 keys (drafts.keys_in_octaves)
    self.assertEqual(
        compiled_costs.needed_cache_bytes(cache, filled),
        2 * layers * batch * (filled + keys) * kv,
    )


class CacheMovesTest(absltest.TestCase):

  def test_finds_large_copies_and_transposes_only(self):
    hlo = "\n".join(
        [
            "  %a = f32[4,264,6,64]{3,2,1,0} copy(f32[4,264,6,64]{3,2,1,0} %x)",
            "  %b = bf16[4,6,64,264]{3,2,1,0} transpose(bf16[4,264,6,64] %y)",
            "  %c = f32[4,6]{1,0} transpose(f32[6,4]{1,0} %z)",
            "  %d = f32[4,264,6,64]{3,2,1,0} add(f32[4,264,6,64] %x, %x)",
            "  %e = (f32[2], s32[]) tuple(%p, %q)",
        ]
    )
    threshold = 4 * 264 * 6 * 64 * 2  # bytes of one bfloat16 cache layer
    self.assertEqual(
        compiled_costs.cache_moves(hlo, threshold),
        ("copy f32[4,264,6,64]", "transpose bf16[4,6,64,264]"),
    )


class CallCostsTest(GinTestCase):

  def test_tiny_call(self):
    config = _tiny()
    one = compiled_costs.call_costs(config, 2, 1, 8, 16, 4)
    four = compiled_costs.call_costs(config, 2, 4, 8, 16, 4)
    for costs in (one, four):
      # A call reads each parameter it uses at least once.
      self.assertGreaterEqual(costs.bytes_accessed, costs.param_bytes)
      self.assertGreaterEqual(costs.offchip_bytes, costs.param_bytes)
      self.assertAlmostEqual(
          costs.offchip_over_needed,
          costs.offchip_bytes / (costs.param_bytes + costs.cache_bytes),
      )
      self.assertGreater(costs.hlo_ops, 0)
      self.assertAlmostEqual(
          costs.bytes_over_needed,
          costs.bytes_accessed / (costs.param_bytes + costs.cache_bytes),
      )
    self.assertGreater(four.flops, 2 * one.flops)

  def test_bucketed_call_attends_its_bound(self):
    config = _tiny()
    whole = compiled_costs.call_costs(config, 2, 8, 8, 264, 128)
    bucketed = compiled_costs.call_costs(
        dataclasses.replace(config, attention_buckets=4), 2, 8, 8, 264, 128
    )
    self.assertEqual(whole.key_limit, 264)
    # 128 + 8 positions: the second of the bounds 72, 136, 200, 264.
    self.assertEqual(bucketed.key_limit, 136)
    self.assertEqual(bucketed.cache_bytes, whole.cache_bytes)
    # Attention's dots over 136 keys rather than 264.
    self.assertLess(bucketed.flops, whole.flops)
    # The call reads a cache cut to the bound, as one of that capacity: no
    # prefix of a larger cache sliced or copied out first.
    cut = compiled_costs.call_costs(config, 2, 8, 8, 136, 128)
    self.assertEqual(bucketed.offchip_bytes, cut.offchip_bytes)

  def test_compiles_for_a_given_device_with_free_layouts(self):
    # The path a TPU topology's chip takes, here with the host's CPU.
    config = _tiny()
    host = compiled_costs.call_costs(config, 2, 1, 8, 16, 4)
    placed = compiled_costs.call_costs(
        config, 2, 1, 8, 16, 4, device=jax.devices()[0]
    )
    self.assertEqual(placed.param_bytes, host.param_bytes)
    self.assertEqual(placed.cache_bytes, host.cache_bytes)
    self.assertGreaterEqual(placed.bytes_accessed, placed.param_bytes)
    self.assertGreater(placed.hlo_ops, 0)

  def test_unknown_tpu_topology_names_it(self):
    # Without libtpu this fails for want of it; with it, for the name.
    with self.assertRaisesRegex(ValueError, "no_such_chip:9x9"):
      compiled_costs.tpu_device("no_such_chip:9x9")


if __name__ == "__main__":
  absltest.main()
