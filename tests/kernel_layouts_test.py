"""benchmarks/kernel_layouts.py: both layouts timed, ratios from the times."""

import pathlib
import sys

from absl.testing import absltest
import jax

from spec_decode.models import t5

import fake_models

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from benchmarks import kernel_layouts  # pylint: disable=g-import-not-at-top,wrong-import-position


class KernelLayoutsTest(absltest.TestCase):

  def test_measure_on_a_tiny_t5(self):
    config = fake_models.tiny_t5(64)
    params = t5.init_params(config, jax.random.key(0))
    results = kernel_layouts.measure(config, params, max_tokens=2, rounds=1)
    for layout in kernel_layouts.LAYOUTS:
      ms = results["ms_per_call"][layout]
      self.assertEqual(list(ms), [1, 2])
      self.assertTrue(all(value > 0 for value in ms.values()))
      self.assertAlmostEqual(results["over_1_token"][layout][2], ms[2] / ms[1])
    self.assertAlmostEqual(
        results["transposed_over_t5x"][1],
        results["ms_per_call"]["transposed"][1]
        / results["ms_per_call"]["t5x"][1],
    )


if __name__ == "__main__":
  absltest.main()
