"""The T5 model against an independent one, transformers' PyTorch T5, given
our parameters by hf_reference's name map, in float32."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import small_t5
from spec_decode.models import t5

# Against transformers' PyTorch T5, in float32 (as in hf_parity_test).
TORCH_ATOL = 1e-4
_config = small_t5.config
_jitted_decode = small_t5.jitted_decode


class TorchReferenceTest(parameterized.TestCase):
  """The model itself against an independent one: transformers' PyTorch T5.

  The tests of t5_test.py hold the cache to the module's own teacher-forced
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
