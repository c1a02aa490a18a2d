"""A shared-encoder draft (T5Config.shared_encoder_dim): a T5 decoder that
cross-attends, through a projection, to its target's encoder output."""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

import small_t5
from spec_decode.models import t5

ATOL = small_t5.ATOL
_config = small_t5.config
_jitted_decode = small_t5.jitted_decode


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


if __name__ == "__main__":
  absltest.main()
