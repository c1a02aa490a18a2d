"""The target logits a decode acts on: rows whose logits go NaN or inf are
flagged and their ids stay in the vocabulary (a NaN draft changes nothing),
and T5Config.logits_dtype sets the logits' dtype."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import fake_models
import tiny_pair
from spec_decode import decoding
from spec_decode import sampling
from spec_decode import speculative
from spec_decode.models import t5

_DRAFT = tiny_pair.DRAFT


class _Poisoned:
  """A fake model whose logits are NaN (or +inf) on the rows marked."""

  def __init__(self, model, rows, value):
    self.model, self.rows, self.value = model, rows, value

  def __call__(self, tokens, cache):
    logits, cache = self.model(tokens, cache)
    return jnp.where(self.rows[:, None, None], self.value, logits), cache


jax.tree_util.register_pytree_node(
    _Poisoned,
    lambda p: ((p.model, p.rows, p.value), None),
    lambda _, children: _Poisoned(*children),
)


class NonfiniteLogitsTest(parameterized.TestCase):
  """Rows whose target logits go NaN or inf are flagged; ids stay in range."""

  @parameterized.product(
      temperature=(0.0, 1.0), value=(float("nan"), float("inf"))
  )
  def test_loops_flag_the_rows_and_stay_in_the_vocabulary(
      self, temperature, value
  ):
    vocab_size, batch_size = 11, 4
    model = fake_models.random_model(0, vocab_size)
    rows = jnp.array([False, True, False, True])
    target = _Poisoned(model, rows, jnp.float32(value))
    draft = fake_models.perturbed(model, 1, 0.5)
    contexts = fake_models.context_ids(batch_size)
    config = sampling.SamplingConfig(temperature)
    base = decoding.autoregressive_decode(
        target,
        model.init_cache(contexts, 20),
        jax.random.key(0),
        max_decode_len=12,
        config=config,
    )
    spec = speculative.speculative_decode(
        target,
        draft,
        model.init_cache(contexts, 20),
        model.init_cache(contexts, 20),
        jax.random.key(0),
        gamma=3,
        max_decode_len=12,
        config=config,
    )
    for result in (base, spec):
      np.testing.assert_array_equal(result.nonfinite, rows)
      self.assertTrue(np.all(np.asarray(result.sequences) < vocab_size))
      self.assertTrue(np.all(np.asarray(result.sequences) >= 0))

  def test_a_nan_draft_is_not_counted_and_changes_nothing(self):
    model = fake_models.random_model(0, 11)
    contexts = fake_models.context_ids(3)
    draft = _Poisoned(model, jnp.ones((3,), bool), jnp.float32(jnp.nan))
    args = dict(max_decode_len=12, config=sampling.SamplingConfig(0.0))
    base = decoding.autoregressive_decode(
        model, model.init_cache(contexts, 20), jax.random.key(0), **args
    )
    spec = speculative.speculative_decode(
        model,
        draft,
        model.init_cache(contexts, 20),
        model.init_cache(contexts, 20),
        jax.random.key(0),
        gamma=2,
        **args,
    )
    np.testing.assert_array_equal(spec.sequences, base.sequences)
    self.assertFalse(np.any(spec.nonfinite))


class LogitsDtypeTest(absltest.TestCase):
  """T5Config.logits_dtype, the knob of the README's bfloat16 measurement."""

  def test_float32_logits_by_default_bfloat16_on_request(self):
    params = t5.init_params(_DRAFT, jax.random.key(0))
    tokens = jnp.array([[3, 4, 1]])
    for dtype in ("float32", "bfloat16"):
      config = dataclasses.replace(_DRAFT, dtype="bfloat16", logits_dtype=dtype)
      logits = t5.Transformer(config).apply({"params": params}, tokens, tokens)
      self.assertEqual(logits.dtype, jnp.dtype(dtype))
    with self.assertRaisesRegex(ValueError, "T5Config.logits_dtype must be"):
      dataclasses.replace(_DRAFT, logits_dtype="float16")


if __name__ == "__main__":
  absltest.main()
