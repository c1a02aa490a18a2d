"""The suite's compile flags change no result.

conftest.py compiles the suite's programs with `xla_flags.FAST_COMPILE`:
XLA:CPU's elemental IR emitters and LLVM at -O1, a third less compile
time. The programs users run compile with XLA's defaults. Here a process
with the defaults computes a T5's logits (float32 and bfloat16) and a
sampled speculative decode, and this process, under the suite's flags,
must compute the same bits. (Fast math, for one, fails it: the logits
differ by up to 3e-5.)
"""

import dataclasses
import os
import subprocess
import sys
import tempfile

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

import fake_models
import small_t5
import xla_flags
from spec_decode import sampling
from spec_decode import speculative
from spec_decode.models import t5

_SUITE_ONLY = tuple(xla_flags.name(flag) for flag in xla_flags.FAST_COMPILE)
_TESTS = os.path.dirname(os.path.abspath(__file__))


def _t5_logits(dtype):
  """T5 1.1's teacher-forced logits [2, 5, 97] on random parameters."""
  config = dataclasses.replace(small_t5.config("t5_1_1"), dtype=dtype)
  model = t5.Transformer(config)
  params = t5.init_params(config, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 6), 2, 97)
  logits = jax.jit(lambda p, x, y: model.apply({"params": p}, x, y))(
      params, tokens, tokens[:, :5]
  )
  return np.asarray(logits.astype(jnp.float32))


def _sampled_decode():
  """A top-p speculative decode of 64 rows: its tokens [64, 8]."""
  target = fake_models.random_model(0, 32, scale=1.5)
  draft = fake_models.perturbed(target, 1, 0.5)
  contexts = fake_models.context_ids(64)
  result = speculative.speculative_decode(
      target,
      draft,
      target.init_cache(contexts, 12),
      draft.init_cache(contexts, 12),
      jax.random.key(2),
      gamma=3,
      max_decode_len=8,
      config=sampling.SamplingConfig(temperature=0.8, top_p=0.9),
  )
  return np.asarray(result.sequences)


def outputs():
  """What both processes compute: {name: array}."""
  return {
      "float32": _t5_logits("float32"),
      "bfloat16": _t5_logits("bfloat16"),
      "decode": _sampled_decode(),
  }


def _save(path):
  np.savez(path, **outputs())


class FastCompileTest(absltest.TestCase):

  def test_defaults_compute_the_same_bits(self):
    flags = os.environ["XLA_FLAGS"].split()
    for name in _SUITE_ONLY:
      self.assertTrue(any(f.startswith(name) for f in flags), name)
    default_flags = [f for f in flags if not f.startswith(_SUITE_ONLY)]
    # JAX's persistent compilation cache keys a program by XLA_FLAGS too, so
    # this process compiles its own programs.
    env = dict(os.environ, XLA_FLAGS=" ".join(default_flags))
    with tempfile.TemporaryDirectory() as directory:
      path = os.path.join(directory, "defaults.npz")
      subprocess.run(
          [
              sys.executable,
              "-c",
              f"import xla_flags_test; xla_flags_test._save({path!r})",
          ],
          cwd=_TESTS,
          env=env,
          check=True,
      )
      with np.load(path) as defaults:
        for name, value in outputs().items():
          np.testing.assert_array_equal(value, defaults[name], err_msg=name)


if __name__ == "__main__":
  absltest.main()
