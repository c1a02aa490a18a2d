"""Which drafts can run with which targets (`pair.check_pair`)."""

import dataclasses

from absl.testing import absltest

from spec_decode import pair
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


if __name__ == "__main__":
  absltest.main()
