"""Which drafts can run with which targets (`pair.check_pair`), and loading."""

import dataclasses
import pathlib
import tempfile

from absl.testing import absltest
from flax import serialization
import gin
import jax
import numpy as np

from spec_decode import gin_config
from spec_decode import pair
from spec_decode import partitioning
from spec_decode.models import t5
from spec_decode.models.config import T5Config

TARGET = T5Config(
    vocab_size=32,
    emb_dim=16,
    num_heads=2,
    head_dim=8,
    mlp_dim=32,
    num_encoder_layers=1,
    num_decoder_layers=2,
)
DRAFT = dataclasses.replace(TARGET, emb_dim=8, num_decoder_layers=1)
SHARED = dataclasses.replace(DRAFT, num_encoder_layers=0, shared_encoder_dim=16)


class CheckPairTest(absltest.TestCase):

  def test_valid_pairs_pass(self):
    pair.check_pair(TARGET, DRAFT)
    pair.check_pair(TARGET, SHARED)
    pair.check_pair(TARGET, TARGET)

  def test_vocabularies_must_match(self):
    with self.assertRaisesRegex(
        ValueError,
        r"^the draft's vocab_size \(64\) differs from the target's \(32\)",
    ):
      pair.check_pair(TARGET, dataclasses.replace(DRAFT, vocab_size=64))

  def test_shared_encoder_width_must_be_the_targets(self):
    with self.assertRaisesRegex(
        ValueError,
        r"^the draft's shared_encoder_dim \(24\) differs from the target's "
        r"emb_dim \(16\)",
    ):
      pair.check_pair(
          TARGET, dataclasses.replace(SHARED, shared_encoder_dim=24)
      )

  def test_a_shared_encoder_model_is_no_target(self):
    with self.assertRaisesRegex(
        ValueError, r"^the target is a shared-encoder draft"
    ):
      pair.check_pair(SHARED, SHARED)


class LoadTransposedTest(absltest.TestCase):
  """A transposed_kernels model loads a t5x checkpoint, kernels transposed."""

  def tearDown(self):
    gin.clear_config()
    super().tearDown()

  def test_load_model_transposes_the_checkpoints_kernels(self):
    params = t5.init_params(TARGET, jax.random.key(0))
    directory = pathlib.Path(tempfile.mkdtemp()) / "checkpoint_1"
    directory.mkdir()
    (directory / "checkpoint").write_bytes(
        serialization.msgpack_serialize({"target": params, "state": {}})
    )
    bindings = [
        f"target/checkpoint_path.path = '{directory}'",
        *(
            f"target/T5Config.{name} = {getattr(TARGET, name)!r}"
            for name in (
                "vocab_size",
                "emb_dim",
                "num_heads",
                "head_dim",
                "mlp_dim",
                "num_encoder_layers",
                "num_decoder_layers",
            )
        ),
        "target/T5Config.transposed_kernels = True",
    ]
    gin_config.parse(bindings=bindings)
    mesh = partitioning.make_mesh(num_devices=2, model_parallel=2)
    loaded = pair.load_model("target", mesh)
    self.assertTrue(loaded.config.transposed_kernels)
    kernel = loaded.params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    original = params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    np.testing.assert_array_equal(kernel, original.T)
    # Split as its reversed axes say: ('mlp', 'embed'), 'mlp' over 'model'.
    self.assertEqual(kernel.sharding.spec[0], "model")
    inputs = np.array([[5, 6, 7, 1]])
    targets = np.array([[0, 3, 4, 5]])
    np.testing.assert_allclose(
        loaded.model.apply({"params": loaded.params}, inputs, targets),
        t5.Transformer(TARGET).apply({"params": params}, inputs, targets),
        atol=1e-5,
        rtol=0,
    )


if __name__ == "__main__":
  absltest.main()
