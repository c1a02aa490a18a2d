"""benchmarks/small_dots.py runs end to end and its ratios follow its times."""

import json
import pathlib
import subprocess
import sys
import tempfile

from absl.testing import absltest

_ROOT = pathlib.Path(__file__).resolve().parent.parent


class SmallDotsTest(absltest.TestCase):

  def test_cli_writes_times_and_ratios(self):
    with tempfile.TemporaryDirectory() as tmp:
      output = pathlib.Path(tmp) / "dots.json"
      done = subprocess.run(
          [
              sys.executable,
              str(_ROOT / "benchmarks" / "small_dots.py"),
              "--repeats=1",
              "--max_rows=3",
              f"--output={output}",
          ],
          check=True,
          capture_output=True,
          text=True,
          cwd=_ROOT,
      )
      results = json.loads(output.read_text())
    self.assertEqual(results["megabytes"], 24 * 512 * 2048 * 4 / 1e6)
    self.assertEqual(results["machine"]["platform"], "cpu")
    for name in ("xla", "numpy"):
      ms = results[f"{name}_ms"]
      self.assertEqual(list(ms), ["1", "2", "3"])
      self.assertTrue(all(value > 0 for value in ms.values()))
      for m, ratio in results[f"{name}_over_1_row"].items():
        self.assertAlmostEqual(ratio, ms[m] / ms["1"], places=12)
      self.assertIn(f"{name:5s} rows:ms(over 1 row) 1:", done.stdout)


if __name__ == "__main__":
  absltest.main()
