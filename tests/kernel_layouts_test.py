"""benchmarks/kernel_layouts.py: every layout timed, ratios from the times.

`measure` runs in a subprocess: the script defines absl flags, which would
clash with other modules' flags in the test process.
"""

import json
import pathlib
import subprocess
import sys

from absl.testing import absltest

_ROOT = pathlib.Path(__file__).resolve().parent.parent

_MEASURE_TINY = """
import json, sys
import jax
sys.path.insert(0, ".")
sys.path.insert(0, "tests")
from benchmarks import kernel_layouts
import fake_models
from spec_decode.models import t5
config = fake_models.tiny_t5(64)
params = t5.init_params(config, jax.random.key(0))
print(json.dumps(kernel_layouts.measure(config, params, max_tokens=2, rounds=1)))
"""


class KernelLayoutsTest(absltest.TestCase):

  def test_measure_on_a_tiny_t5(self):
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE_TINY],
        cwd=_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for layout in ("t5x", "transposed", "few_rows"):
      ms = results["ms_per_call"][layout]
      self.assertEqual(list(ms), ["1", "2"])
      self.assertTrue(all(value > 0 for value in ms.values()))
      self.assertAlmostEqual(
          results["over_1_token"][layout]["2"], ms["2"] / ms["1"]
      )
    for layout in ("transposed", "few_rows"):
      self.assertAlmostEqual(
          results["over_t5x"][layout]["1"],
          results["ms_per_call"][layout]["1"]
          / results["ms_per_call"]["t5x"]["1"],
      )


if __name__ == "__main__":
  absltest.main()
