"""Tests for spec_decode.decoding, the baseline decoder."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

import fake_models
from spec_decode import decoding
from spec_decode import sampling

GREEDY = sampling.SamplingConfig(temperature=0.0)


def _greedy_by_hand(model, contexts, max_decode_len, eos_id):
  """Greedy decoding one row and one step at a time, on the host."""
  sequences = np.zeros((len(contexts), max_decode_len), np.int32)
  for b, context in enumerate(contexts):
    cache = model.init_cache([context], max_decode_len)
    token = decoding.BOS_ID
    for i in range(max_decode_len):
      logits, cache = model(np.array([[token]]), cache)
      token = int(np.argmax(logits[0, 0]))
      sequences[b, i] = token
      if token == eos_id:
        break
  return sequences


class AutoregressiveDecodeTest(parameterized.TestCase):

  def test_greedy_matches_step_by_step_decoding(self):
    model = fake_models.random_model(0, 12, eos_bias=1.5)
    contexts = fake_models.context_ids(5)
    result = decoding.autoregressive_decode(
        model,
        model.init_cache(contexts, 10),
        jax.random.key(0),
        max_decode_len=10,
        config=GREEDY,
    )
    expected = _greedy_by_hand(model, contexts, 10, eos_id=1)
    np.testing.assert_array_equal(result.sequences, expected)
    # Rows end at different times: right after EOS, or at max_decode_len.
    ends_with_eos = [1 in row for row in expected]
    self.assertIn(True, ends_with_eos)
    self.assertIn(False, ends_with_eos)
    expected_lengths = [
        list(row).index(1) + 1 if 1 in row else 10 for row in expected
    ]
    np.testing.assert_array_equal(result.lengths, expected_lengths)
    np.testing.assert_array_equal(result.target_calls, expected_lengths)

  def test_sampling_is_reproducible_and_keyed(self):
    model = fake_models.random_model(1, 12)
    contexts = fake_models.context_ids(4)

    def decode(seed):
      return decoding.autoregressive_decode(
          model,
          model.init_cache(contexts, 8),
          jax.random.key(seed),
          max_decode_len=8,
          eos_id=5,
      ).sequences

    np.testing.assert_array_equal(decode(0), decode(0))
    self.assertFalse(np.array_equal(decode(0), decode(1)))

  def test_one_compiled_loop_samples_at_every_temperature(self):
    """The temperature is traced: a loop compiled at one temperature samples
    at another exactly as a loop compiled for it does."""
    model = fake_models.random_model(1, 12)
    contexts = fake_models.context_ids(6)

    def decode(temperature):
      return decoding.autoregressive_decode(
          model,
          model.init_cache(contexts, 8),
          jax.random.key(0),
          max_decode_len=8,
          config=sampling.SamplingConfig(temperature),
      ).sequences

    jax.clear_caches()
    alone = decode(0.4)
    jax.clear_caches()
    decode(1.5)
    after_another = decode(0.4)
    np.testing.assert_array_equal(after_another, alone)
    self.assertFalse(np.array_equal(decode(1.5), alone))
    self.assertEqual(decoding._autoregressive_decode._cache_size(), 1)  # pylint: disable=protected-access

  @parameterized.named_parameters(
      ("zero_length", dict(max_decode_len=0), "max_decode_len"),
      ("float_length", dict(max_decode_len=4.0), "max_decode_len"),
      ("float_eos", dict(max_decode_len=4, eos_id=1.0), "eos_id"),
      ("bool_length", dict(max_decode_len=True), "max_decode_len"),
      ("bool_eos", dict(max_decode_len=4, eos_id=True), "eos_id"),
  )
  def test_invalid_arguments_raise(self, kwargs, name):
    model = fake_models.random_model(0, 4)
    with self.assertRaisesRegex(ValueError, f"^{name} must be"):
      decoding.autoregressive_decode(
          model, model.init_cache([0], 4), jax.random.key(0), **kwargs
      )

  def test_a_cache_without_room_for_every_token_is_refused(self):
    # Its last call's keys would be dropped: a silent wrong last token.
    model = fake_models.random_model(0, 4)
    with self.assertRaisesRegex(
        ValueError,
        "^cache holds 11 decoder positions; max_decode_len 12 tokens need "
        "12.$",
    ):
      decoding.autoregressive_decode(
          model,
          fake_models.abstract_t5_cache(11),
          jax.random.key(0),
          max_decode_len=12,
      )


if __name__ == "__main__":
  absltest.main()
