"""Logits parity with transformers' PyTorch T5, the reference implementation.

The same random weights go into both models through a saved Hugging Face
checkpoint and `checkpoints.load_params`. Sequences are longer than the
relative-position buckets' max distance (128), and the batch is padded.
"""

import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from spec_decode import checkpoints
from spec_decode.models import t5
import hf_reference

# float32 throughout; the two implementations sum in different orders.
ATOL = 1e-4
# Weight scales (see _save_hf_model): T5 1.0 divides its logits by
# sqrt(emb_dim), so it needs larger weights for logits of the same size.
WEIGHT_STD = {"t5_1_1": 0.2, "t5_1_0": 0.5}
ENCODER_LEN = 150
DECODER_LEN = 140


def _configs():
  common = dict(
      vocab_size=128,
      emb_dim=32,
      num_heads=4,
      head_dim=8,
      mlp_dim=64,
      num_encoder_layers=2,
      num_decoder_layers=2,
  )
  return {
      "t5_1_1": t5.T5Config(**common),
      "t5_1_0": t5.T5Config(
          **common, mlp_activations=("relu",), logits_via_embedding=True
      ),
  }


def _save_hf_model(config, directory, std):
  """Saves a random HF T5 of `config` to `directory`; returns the model.

  Args:
    config: the model's T5Config.
    directory: where to save it.
    std: the weights' standard deviation. Activations, and with them the
      float32 rounding differences between the implementations, grow quickly
      with it; the values used give logits of magnitude > 1.

  Returns:
    The transformers model.
  """
  torch.manual_seed(0)
  model = transformers.T5ForConditionalGeneration(
      hf_reference.hf_config(config)
  ).eval()
  with torch.no_grad():  # Weights of T5's scale, not the tiny default init.
    for param in model.parameters():
      param.normal_(0.0, std)
  if not config.logits_via_embedding:
    hf_reference.untie_lm_head(
        model, torch.randn(config.vocab_size, config.emb_dim)
    )
  model.save_pretrained(directory)
  return model


def _batch(vocab_size):
  rng = np.random.default_rng(0)
  inputs = rng.integers(2, vocab_size, (3, ENCODER_LEN))
  inputs[1, 90:] = 0  # Padded rows.
  inputs[2, 7:] = 0
  targets = rng.integers(2, vocab_size, (3, DECODER_LEN))
  targets[:, 0] = 0
  return inputs.astype(np.int32), targets.astype(np.int32)


class HfParityTest(parameterized.TestCase):

  @parameterized.parameters("t5_1_1", "t5_1_0")
  def test_logits_match(self, family):
    config = _configs()[family]
    with tempfile.TemporaryDirectory() as directory:
      hf_model = _save_hf_model(config, directory, WEIGHT_STD[family])
      params = checkpoints.load_params(directory, t5.param_shapes(config))
    inputs, targets = _batch(config.vocab_size)
    with torch.no_grad():
      expected = hf_model(
          input_ids=torch.from_numpy(inputs).long(),
          attention_mask=torch.from_numpy(inputs > 0).long(),
          decoder_input_ids=torch.from_numpy(targets).long(),
      ).logits.numpy()
    self.assertGreater(np.abs(expected).max(), 1.0)

    model = t5.Transformer(config)
    variables = {"params": params}
    full = model.apply(variables, inputs, targets)
    np.testing.assert_allclose(full, expected, rtol=0, atol=ATOL)

    # The cached path: a 100-token prefill, then a gamma + 1 = 8 chunk, then
    # single steps past position 128.
    encoded = model.apply(variables, inputs, method=model.encode)
    cache = model.apply(
        variables, encoded, inputs, DECODER_LEN, method=model.init_cache
    )
    decoder = t5.make_decode_fn(model, params)
    decode = jax.jit(lambda tokens, cache: decoder(tokens, cache))
    chunks = []
    for start, stop in [(0, 100), (100, 108)] + [
        (t, t + 1) for t in range(108, DECODER_LEN)
    ]:
      logits, cache = decode(jnp.asarray(targets[:, start:stop]), cache)
      chunks.append(logits)
    np.testing.assert_allclose(
        np.concatenate(chunks, axis=1), expected, rtol=0, atol=ATOL
    )


if __name__ == "__main__":
  absltest.main()
