"""Bytes per device from shapes and logical axes, and the plan's table."""

import dataclasses

from absl.testing import absltest
import gin
import jax
import jax.numpy as jnp

from spec_decode import gin_config
from spec_decode import memory_plan
from spec_decode import partitioning
from spec_decode.models import t5

_P = jax.sharding.PartitionSpec
_XXL = 11_135_332_352


def _tree():
  shapes = {
      "kernel": jax.ShapeDtypeStruct((8, 12), jnp.bfloat16),
      "bias": jax.ShapeDtypeStruct((12,), jnp.float32),
      "scale": jax.ShapeDtypeStruct((8,), jnp.float32),
      "cache": jax.ShapeDtypeStruct((4, 6), jnp.bfloat16),
  }
  axes = {
      "kernel": _P("embed", "mlp"),
      "bias": _P("mlp"),
      "scale": _P("embed"),
      "cache": _P("cache_batch", "cache_heads"),
  }
  return shapes, axes


def _xxl_config():
  gin_config.parse(["models/t5_1_1_xxl.gin"])
  return dataclasses.replace(t5.T5Config(), dtype="bfloat16")


class PerDeviceBytesTest(absltest.TestCase):

  def tearDown(self):
    gin.clear_config()
    super().tearDown()

  def test_hand_built_tree(self):
    shapes, axes = _tree()
    mesh = {"data": 2, "model": 3}
    self.assertEqual(
        memory_plan.leaf_bytes(shapes, axes, mesh),
        {
            "kernel": 8 * (12 // 3) * 2,  # split over model, bf16
            "bias": (12 // 3) * 4,  # split over model, f32
            "scale": 8 * 4,  # replicated
            "cache": (4 // 2) * (6 // 3) * 2,  # split over data and model
        },
    )
    self.assertEqual(memory_plan.per_device_bytes(shapes, axes, mesh), 120)
    replicate = partitioning.rules(replicate_model=True)
    self.assertEqual(
        memory_plan.per_device_bytes(shapes, axes, mesh, replicate),
        8 * 12 * 2 + 12 * 4 + 8 * 4 + (4 // 2) * 6 * 2,
    )

  def test_prefix_spec(self):
    shapes, _ = _tree()
    self.assertEqual(
        memory_plan.per_device_bytes(shapes, _P(), {"data": 4, "model": 4}),
        8 * 12 * 2 + 12 * 4 + 8 * 4 + 4 * 6 * 2,
    )

  def test_not_divisible_names_the_leaf(self):
    shapes, axes = _tree()
    with self.assertRaisesRegex(
        memory_plan.NotShardableError, "bias: mlp 12 over model 5"
    ):
      memory_plan.per_device_bytes(shapes, axes, {"data": 1, "model": 5})

  def test_xxl_params_in_bfloat16(self):
    config = _xxl_config()
    shapes = memory_plan.param_shapes(config)
    axes = t5.param_logical_axes(config)
    whole = memory_plan.leaf_bytes(shapes, axes, {"data": 1, "model": 1})
    self.assertEqual(sum(jax.tree.leaves(whole)), _XXL * 2)
    split = memory_plan.leaf_bytes(shapes, axes, {"data": 1, "model": 4})
    specs = jax.tree.map(
        partitioning.mesh_spec, axes, is_leaf=lambda x: isinstance(x, _P)
    )
    num_sharded = 0
    for one, four, spec in zip(
        jax.tree.leaves(whole),
        jax.tree.leaves(split),
        jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, _P)),
    ):
      if "model" in spec:
        num_sharded += 1
        self.assertEqual(four * 4, one)
      else:
        self.assertEqual(four, one)
    self.assertGreater(num_sharded, 0)

  def test_cache_shapes_of_a_shared_encoder_draft(self):
    config = t5.T5Config(
        vocab_size=64,
        emb_dim=8,
        num_heads=2,
        head_dim=4,
        num_encoder_layers=0,
        num_decoder_layers=1,
        shared_encoder_dim=16,
        dtype="bfloat16",
    )
    cache = memory_plan.cache_shapes(
        config, memory_plan.param_shapes(config), 3, 7, 12
    )
    self.assertEqual(cache.keys[0].shape, (3, 2, 4, 12))
    # 7 input positions hold 8 keys (drafts.keys_in_octaves).
    self.assertEqual(cache.cross_keys[0].shape, (3, 2, 4, 8))
    self.assertEqual(cache.cross_keys[0].dtype, jnp.bfloat16)

  def test_meshes(self):
    self.assertEqual(memory_plan.meshes(4, 1), [(1, 4)])
    self.assertEqual(memory_plan.meshes(4, 8), [(1, 4), (2, 2)])
    self.assertEqual(memory_plan.meshes(8, 8), [(1, 8), (2, 4)])
    self.assertEqual(memory_plan.meshes(16, 8), [(1, 16), (2, 8), (8, 2)])


class TableTest(absltest.TestCase):

  def tearDown(self):
    gin.clear_config()
    super().tearDown()

  def test_xxl_small_ende(self):
    text = memory_plan.table(["t5_1_1_xxl_small_ende.gin"])
    rows = [line for line in text.splitlines() if line.startswith("| v")]
    keys = [tuple(c.strip() for c in row.split("|")[1:5]) for row in rows]
    expected = [
        (tpu, mesh, batch, draft)
        for tpu, meshes in (
            ("v4-8", {"1": ["(1, 4)"], "8": ["(1, 4)", "(2, 2)"]}),
            ("v5e-8", {"1": ["(1, 8)"], "8": ["(1, 8)", "(2, 4)"]}),
            (
                "v4-32",
                {"1": ["(1, 16)"], "8": ["(1, 16)", "(2, 8)", "(8, 2)"]},
            ),
        )
        for batch in ("1", "8")
        for mesh in meshes[batch]
        for draft in ("replicated", "split")
    ]
    self.assertEqual(keys, expected)
    by_key = dict(zip(keys, rows))
    # 11.1B bf16 parameters over 4 chips: 20.74 GiB / 4.
    self.assertIn(
        "| 5.19 | 0.14 |", by_key["v4-8", "(1, 4)", "1", "replicated"]
    )
    self.assertIn("yes (", by_key["v4-8", "(1, 4)", "1", "replicated"])
    # The draft's 6 heads do not split 4 ways, but do 2 ways.
    self.assertIn(
        "not shardable: draft", by_key["v4-8", "(1, 4)", "1", "split"]
    )
    self.assertIn("yes (", by_key["v4-8", "(2, 2)", "8", "split"])
    self.assertIn("cache capacity 264", text)

  def test_auto_gamma_is_planned_at_max_gamma(self):
    text = memory_plan.table(
        ["t5_1_1_xxl_small_ende.gin"],
        ["run.gamma = 'auto'", "run.max_gamma = 5"],
    )
    self.assertIn(
        "cache capacity 264 (max_decode_len 256 + max_gamma 5 + 1, the room "
        "rounded up to 8s)",
        text,
    )

  def test_bad_run_files_are_one_line_errors(self):
    for files, bindings, message in (
        (["no_such_run.gin"], [], "^gin file no_such_run.gin not found"),
        (
            ["t5_1_1_xxl_small_ende.gin"],
            ["run.gamma = 'x'"],
            "^run.gamma must be an int >= 1, got 'x'$",
        ),
        (
            ["t5_1_1_xxl_small_ende.gin"],
            ["run.max_decode_len = 0"],
            "^run.max_decode_len must be an int >= 1, got 0$",
        ),
    ):
      with self.subTest(message=message):
        with self.assertRaisesRegex(ValueError, message):
          memory_plan.table(files, bindings)


if __name__ == "__main__":
  absltest.main()
