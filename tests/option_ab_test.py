"""benchmarks/option_ab.py runs end to end on the demo pair, and refuses an
option that would change the parameters both settings share."""

import json
import pathlib
import subprocess
import sys
import tempfile

from absl.testing import absltest

_ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(output, option):
  return subprocess.run(
      [
          sys.executable,
          str(_ROOT / "benchmarks" / "option_ab.py"),
          "--gin_file=configs/demo.gin",
          f"--option={option}",
          "--sentences=2",
          "--rounds=1",
          "--calls=2",
          f"--output={output}",
      ],
      capture_output=True,
      text=True,
      cwd=_ROOT,
  )


class OptionAbTest(absltest.TestCase):

  def test_per_query_attention_changes_no_token(self):
    with tempfile.TemporaryDirectory() as tmp:
      output = pathlib.Path(tmp) / "option_ab.json"
      done = _run(output, "per_query_attention")
      self.assertEqual(done.returncode, 0, done.stderr[-2000:])
      point = json.loads(output.read_text())
    self.assertTrue(point["same_tokens"])
    # The demo pair's greedy count on its first two sentences at gamma 3,
    # the same under both settings.
    self.assertEqual(point["target_calls"], {"off": 16, "on": 16})
    for name in ("loop", "baseline_loop", "step", "verify", "draft_chunk"):
      self.assertGreater(point["ms"][f"{name}_off"], 0.0)
      self.assertAlmostEqual(
          point["on_over_off"][name],
          point["ms"][f"{name}_on"] / point["ms"][f"{name}_off"],
      )
    for setting in ("off", "on"):
      self.assertAlmostEqual(
          point["loops_speedup"][setting],
          point["ms"][f"baseline_loop_{setting}"]
          / point["ms"][f"loop_{setting}"],
      )

  def test_an_option_that_changes_the_parameters_is_refused(self):
    with tempfile.TemporaryDirectory() as tmp:
      output = pathlib.Path(tmp) / "option_ab.json"
      done = _run(output, "logits_via_embedding")
      self.assertFalse(output.exists())
    self.assertNotEqual(done.returncode, 0)
    self.assertEqual(
        done.stderr.strip().splitlines()[-1],
        "error: --option logits_via_embedding changes the model's "
        "parameters; both settings must run on the same ones",
    )


if __name__ == "__main__":
  absltest.main()
