"""benchmarks/row_tiles.py runs end to end on the demo pair, and times two
different programs: products of 17-64 rows in the kernel's tiles and in XLA's
dot."""

import json
import pathlib
import subprocess
import sys
import tempfile

from absl.testing import absltest

from spec_decode import drafts

_ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(*flags):
  return subprocess.run(
      [
          sys.executable,
          str(_ROOT / "benchmarks" / "row_tiles.py"),
          "--gin_file=configs/demo.gin",
          *flags,
      ],
      capture_output=True,
      text=True,
      cwd=_ROOT,
  )


class RowTilesBenchmarkTest(absltest.TestCase):

  def test_tiles_and_xla_on_the_demo_pair(self):
    with tempfile.TemporaryDirectory() as tmp:
      output = pathlib.Path(tmp) / "row_tiles.json"
      done = _run(
          "--sentences=3",
          "--rows=17",
          "--rounds=1",
          "--megabytes=4",
          f"--output={output}",
          "--gin_bindings=run.max_decode_len = 40",
      )
      self.assertEqual(done.returncode, 0, done.stderr[-2000:])
      point = json.loads(output.read_text())
    # The run config's caches: max_decode_len 40 as bound, demo.gin's gamma 3.
    self.assertEqual(
        point["cache_capacity"], drafts.speculative_capacity(40, 3)
    )
    setup = point["setup"]
    self.assertAlmostEqual(
        setup["tiles_over_xla"],
        setup["tiles_ms_per_sentence"] / setup["xla_ms_per_sentence"],
    )
    # The two set-ups' caches agree to float32 rounding, and differ: each
    # variant was traced with its own products (the demo's first three
    # sentences encode to 24, 32 and 24 tokens).
    self.assertBetween(setup["max_cache_difference"], 1e-7, 1e-3)
    # The target's four weight shapes ([512, 512] once).
    self.assertLen(point["products"], 3)
    for product in point["products"]:
      self.assertEqual(product["rows"], 17)
      self.assertGreater(product["xla_ms"], 0.0)
      self.assertAlmostEqual(
          product["tiles_over_xla"], product["tiles_ms"] / product["xla_ms"]
      )
      self.assertBetween(product["max_difference"], 1e-7, 1e-3)

  def test_rows_outside_the_tiles_are_refused(self):
    done = _run("--rows=16")
    self.assertNotEqual(done.returncode, 0)
    self.assertIn("--rows must be within 17-64", done.stderr)
    self.assertNotIn("Traceback", done.stderr)

  def test_a_gamma_chosen_at_run_time_is_refused(self):
    done = _run("--gin_bindings=run.gamma = 'auto'")
    self.assertNotEqual(done.returncode, 0)
    self.assertIn("run.gamma must be an int >= 1, got 'auto'", done.stderr)
    self.assertNotIn("Traceback", done.stderr)


if __name__ == "__main__":
  absltest.main()
