"""benchmarks/step_costs.py runs end to end and its predictions follow its c.

The script's real use is T5 1.1 XXL on an accelerator; here it runs on the
tiny T5 (target and draft alike), so that the script cannot go stale and its
JSON is checked against `analysis` recomputed from the measured call costs.
"""

import json
import pathlib
import subprocess
import sys
import tempfile

from absl.testing import absltest

from spec_decode import analysis

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_GAMMA = 3
_DECODE_LEN = 8


def _run_tiny(*flags):
  """Runs the script on the tiny T5 (target and draft) and reads its JSON."""
  with tempfile.TemporaryDirectory() as tmp:
    output = pathlib.Path(tmp) / "costs.json"
    subprocess.run(
        [
            sys.executable,
            str(_ROOT / "benchmarks" / "step_costs.py"),
            "--target=t5_1_1_tiny",
            "--draft=t5_1_1_tiny",
            f"--gamma={_GAMMA}",
            f"--output={output}",
            *flags,
        ],
        check=True,
        capture_output=True,
        cwd=_ROOT,
    )
    return json.loads(output.read_text())


class StepCostsTest(absltest.TestCase):

  def test_tiny_run(self):
    results = _run_tiny(
        "--repeats=1", "--input_len=8", f"--max_decode_len={_DECODE_LEN}"
    )
    self.assertEqual(results["gamma"], _GAMMA)
    step = results["target_step_ms"]
    verify = results["target_verify_ms"]
    draft = results["draft_step_ms"]
    for value in (step, verify, draft):
      self.assertGreater(value, 0.0)
    c = results["c"]
    self.assertAlmostEqual(c, draft / step, places=12)
    self.assertAlmostEqual(
        results["verify_over_step"], verify / step, places=12
    )
    self.assertEqual(
        set(results["predictions"]), {"temperature 0", "temperature 1"}
    )
    for prediction in results["predictions"].values():
      alpha = prediction["alpha"]
      self.assertAlmostEqual(
          prediction["theorem_3_8"],
          analysis.walltime_improvement(alpha, _GAMMA, c),
          places=12,
      )
      tokens = analysis.expected_tokens_per_call(alpha, _GAMMA)
      self.assertAlmostEqual(
          prediction["with_measured_verify"],
          tokens * step / (_GAMMA * draft + verify),
          places=12,
      )
      self.assertEqual(
          prediction["optimal_gamma"], analysis.optimal_gamma(alpha, c)
      )
    loop = results["self_draft_loop"]
    self.assertAlmostEqual(
        loop["speedup"],
        loop["baseline_ms_per_token"] / loop["speculative_ms_per_token"],
        places=12,
    )
    self.assertAlmostEqual(
        loop["ideal"], (_GAMMA + 1) * step / (_GAMMA * step + verify), places=12
    )

  def test_tiny_abstract_report(self):
    calls = _run_tiny("--abstract")["calls"]
    self.assertEqual(
        set(calls),
        {
            f"{name}_{tokens}tok_b{batch}{suffix}"
            for name, tokens in (("target", 1), ("target", _GAMMA + 1))
            + (("draft", 1),)
            for batch in (1, 32)
            for suffix in ("", "_float32")
        },
    )
    # The float32 control's parameters take twice the bytes.
    self.assertEqual(
        calls["target_1tok_b1_float32"]["param_bytes"],
        2 * calls["target_1tok_b1"]["param_bytes"],
    )
    # The tiny T5 as target and as draft: the same 1-token calls.
    self.assertEqual(calls["target_1tok_b32"], calls["draft_1tok_b32"])
    for entry in calls.values():
      self.assertAlmostEqual(
          entry["bytes_over_needed"],
          entry["bytes_accessed"]
          / (entry["param_bytes"] + entry["cache_bytes"]),
      )
    # More rows read more cache and look up more embedding rows.
    self.assertGreater(
        calls["target_1tok_b32"]["cache_bytes"],
        calls["target_1tok_b1"]["cache_bytes"],
    )

  def test_tpu_topology_it_cannot_compile_for_is_one_line(self):
    # Without libtpu (as in CI) for want of it; with it, for the name.
    result = subprocess.run(
        [
            sys.executable,
            str(_ROOT / "benchmarks" / "step_costs.py"),
            "--abstract",
            "--tpu_topology=no_such_chip:9x9",
        ],
        capture_output=True,
        text=True,
        cwd=_ROOT,
    )
    self.assertNotEqual(result.returncode, 0)
    last = result.stderr.strip().splitlines()[-1]
    self.assertIn("step_costs.py: cannot compile for TPU topology", last)
    self.assertIn("no_such_chip:9x9", last)
    self.assertNotIn("Traceback", result.stderr)


if __name__ == "__main__":
  absltest.main()
