"""Parameter counts of every size config against transformers' T5."""

from absl.testing import absltest
import gin
import jax
import torch
import transformers

from spec_decode import gin_config
from spec_decode.models import param_count
from spec_decode.models import t5
from spec_decode.models.config import T5Config
import hf_reference


def _hf_count(config):
  """transformers' parameter count for a T5Config, built on the meta device."""
  with torch.device("meta"):
    model = transformers.T5ForConditionalGeneration(
        hf_reference.hf_config(config)
    )
    if not config.logits_via_embedding:
      hf_reference.untie_lm_head(
          model, torch.empty(config.vocab_size, config.emb_dim)
      )
  # parameters() yields a tied (shared) tensor once.
  return sum(p.numel() for p in model.parameters())


class ParamCountTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Tracing every config's init takes about 13 s on 2 CPU cores: once.
    cls.counts = param_count.count_all()
    gin.clear_config()

  def test_every_config_matches_transformers(self):
    counts = self.counts
    public = {
        f"t5_1_{v}_{size}"
        for v, sizes in (
            ("1", ("small", "base", "large", "xl", "xxl")),
            ("0", ("small", "base", "large", "3b", "11b")),
        )
        for size in sizes
    }
    self.assertContainsSubset(public, set(counts))
    for path in gin_config.model_config_files():
      with self.subTest(path.stem):
        gin_config.parse([path])
        if T5Config().shared_encoder_dim:  # No transformers equivalent.
          continue
        self.assertEqual(counts[path.stem], _hf_count(T5Config()))

  def test_shared_encoder_draft_is_the_draft_without_its_encoder(self):
    counts = self.counts
    gin_config.parse(["models/demo_draft.gin"])
    encoder = t5.param_shapes(T5Config())["encoder"]
    encoder_params = sum(x.size for x in jax.tree.leaves(encoder))
    self.assertEqual(
        counts["demo_draft_shared"],
        counts["demo_draft"] - encoder_params + 512 * 128,
    )

  def test_two_layer_shared_encoder_draft_adds_one_decoder_layer(self):
    counts = self.counts
    gin_config.parse(["models/demo_draft_shared_2l.gin"])
    layer = t5.param_shapes(T5Config())["decoder"]["layers_1"]
    self.assertEqual(
        counts["demo_draft_shared_2l"] - counts["demo_draft_shared"],
        sum(x.size for x in jax.tree.leaves(layer)),
    )

  def test_published_sizes(self):
    counts = self.counts
    # t5-small and T5 1.1 XXL as published by their model cards.
    self.assertEqual(counts["t5_1_0_small"], 60_506_624)
    self.assertEqual(counts["t5_1_1_xxl"], 11_135_332_352)

  def tearDown(self):
    gin.clear_config()
    super().tearDown()


if __name__ == "__main__":
  absltest.main()
