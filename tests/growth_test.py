"""Tests for growth.py: a grown T5 computes its source's logits."""

import dataclasses
import os
import tempfile

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import growth
from spec_decode import train_checkpoints
from spec_decode.models import t5
from spec_decode.models.config import T5Config

SMALL = T5Config(
    vocab_size=64,
    emb_dim=16,
    num_heads=2,
    head_dim=8,
    mlp_dim=32,
    num_encoder_layers=1,
    num_decoder_layers=2,
    mlp_activations=("gelu", "linear"),
    logits_via_embedding=False,
)
# Each width grows by its own factor; both stacks gain layers.
LARGE = dataclasses.replace(
    SMALL,
    emb_dim=48,
    num_heads=4,
    mlp_dim=64,
    num_encoder_layers=2,
    num_decoder_layers=4,
)


def _logits(config, params):
  rng = np.random.default_rng(0)
  inputs = jnp.asarray(rng.integers(2, 64, size=(2, 7)), jnp.int32)
  targets = jnp.asarray(rng.integers(2, 64, size=(2, 5)), jnp.int32)
  return t5.Transformer(config).apply({"params": params}, inputs, targets)


def _trained_like(config, seed):
  """Random params with norm scales away from 1, as training leaves them."""
  params = t5.init_params(config, jax.random.key(seed))
  keys = iter(jax.random.split(jax.random.key(seed + 1), 100))
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x
      * jax.random.uniform(next(keys), x.shape, minval=0.5, maxval=1.5)
      if path[-1].key == "scale"
      else x,
      params,
  )


class GrowTest(absltest.TestCase):

  def test_grown_model_computes_the_source_logits(self):
    source = _trained_like(SMALL, 0)
    grown = growth.grow(
        source, t5.init_params(LARGE, jax.random.key(2)), LARGE.head_dim
    )
    expected = _logits(SMALL, source)
    actual = _logits(LARGE, grown)
    # Float32: the grown sums add the same terms in another order.
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=2e-5)
    self.assertGreater(float(jnp.std(expected)), 0.1)

  def test_shapes_are_the_large_models(self):
    grown = growth.grow(
        _trained_like(SMALL, 0),
        t5.init_params(LARGE, jax.random.key(2)),
        LARGE.head_dim,
    )
    expected = t5.param_shapes(LARGE)
    self.assertEqual(jax.tree.structure(grown), jax.tree.structure(expected))
    jax.tree.map(
        lambda g, e: self.assertEqual((g.shape, g.dtype), (e.shape, e.dtype)),
        grown,
        expected,
    )

  def test_appended_layers_write_nothing_to_the_residual_stream(self):
    grown = growth.grow(
        _trained_like(SMALL, 0),
        t5.init_params(LARGE, jax.random.key(2)),
        LARGE.head_dim,
    )
    layer = grown["decoder"]["layers_3"]
    for kernel in (
        layer["self_attention"]["out"]["kernel"],
        layer["encoder_decoder_attention"]["out"]["kernel"],
        layer["mlp"]["wo"]["kernel"],
    ):
      np.testing.assert_array_equal(kernel, 0.0)
    # Their other kernels keep the fresh init, so the zeros get gradients.
    self.assertGreater(
        float(np.std(layer["self_attention"]["query"]["kernel"])), 0.0
    )

  def test_shared_encoder_draft_grows_and_restarts_as_it_is(self):
    small = dataclasses.replace(
        SMALL, num_encoder_layers=0, shared_encoder_dim=24
    )
    large = dataclasses.replace(
        LARGE, num_encoder_layers=0, shared_encoder_dim=24
    )
    rng = np.random.default_rng(0)
    encoded = jnp.asarray(rng.normal(size=(2, 7, 24)), jnp.float32)
    inputs = jnp.asarray(rng.integers(2, 64, size=(2, 7)), jnp.int32)
    targets = jnp.asarray(rng.integers(2, 64, size=(2, 5)), jnp.int32)

    def logits(config, params):
      return t5.Transformer(config).apply(
          {"params": params}, inputs, targets, target_encoded=encoded
      )

    source = _trained_like(small, 0)
    expected = logits(small, source)
    self.assertGreater(float(jnp.std(expected)), 0.1)
    for config in (large, small):
      grown = growth.grow(
          source, t5.init_params(config, jax.random.key(2)), config.head_dim
      )
      np.testing.assert_allclose(
          logits(config, grown), expected, rtol=1e-5, atol=2e-5
      )
    # The same shapes: every leaf comes back unchanged.
    jax.tree.map(np.testing.assert_array_equal, grown, source)

  def test_non_integer_factor_is_refused(self):
    odd = dataclasses.replace(LARGE, emb_dim=40)
    with self.assertRaisesRegex(
        growth.GrowthError, "embedding width.*16 to 40"
    ):
      growth.grow(
          _trained_like(SMALL, 0),
          t5.init_params(odd, jax.random.key(2)),
          odd.head_dim,
      )

  def test_fewer_layers_are_refused(self):
    shallow = dataclasses.replace(LARGE, num_decoder_layers=1)
    with self.assertRaisesRegex(growth.GrowthError, "layers_1"):
      growth.grow(
          _trained_like(SMALL, 0),
          t5.init_params(shallow, jax.random.key(2)),
          shallow.head_dim,
      )

  def test_tied_logits_are_refused(self):
    tied = dataclasses.replace(SMALL, logits_via_embedding=True)
    with self.assertRaisesRegex(growth.GrowthError, "reuse the embedding"):
      growth.grow(
          t5.init_params(tied, jax.random.key(0)),
          t5.init_params(
              dataclasses.replace(LARGE, logits_via_embedding=True),
              jax.random.key(2),
          ),
          LARGE.head_dim,
      )

  def test_grown_params_reads_a_bfloat16_export(self):
    source = _trained_like(SMALL, 0)
    with tempfile.TemporaryDirectory() as directory:
      path = os.path.join(directory, "export")
      train_checkpoints.export_params(source, path, jnp.bfloat16)
      grown = growth.grown_params(path, SMALL, LARGE, jax.random.key(2))
    rounded = jax.tree.map(
        lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), source
    )
    np.testing.assert_allclose(
        _logits(LARGE, grown), _logits(SMALL, rounded), rtol=1e-5, atol=2e-5
    )


if __name__ == "__main__":
  absltest.main()
