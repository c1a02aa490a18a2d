"""benchmarks/loop_overhead.py runs end to end and its ratios add up.

On the tiny T5 as its own draft every drafted token is accepted, so with
max_decode_len a multiple of gamma + 1 each iteration emits exactly gamma + 1
tokens, and both decoders emit the same tokens.
"""

import json
import pathlib
import subprocess
import sys
import tempfile

from absl.testing import absltest

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_GAMMA = 3
_DECODE_LEN = 8


def _run(*flags):
  """Runs the script with one timed round and reads its one point."""
  with tempfile.TemporaryDirectory() as tmp:
    output = pathlib.Path(tmp) / "loop_overhead.json"
    subprocess.run(
        [
            sys.executable,
            str(_ROOT / "benchmarks" / "loop_overhead.py"),
            f"--gammas={_GAMMA}",
            f"--max_decode_len={_DECODE_LEN}",
            "--rounds=1",
            "--calls=2",
            "--input_len=4",
            f"--output={output}",
            *flags,
        ],
        check=True,
        capture_output=True,
        cwd=_ROOT,
    )
    (point,) = json.loads(output.read_text())["points"]
  return point


class LoopOverheadTest(absltest.TestCase):

  def test_shared_encoder_pair_decodes_as_the_baseline(self):
    # The demo target and its shared-encoder draft, which reads the target's
    # encoding: greedy, the speculative tokens are the baseline's.
    point = _run("--gin_file=configs/demo_shared.gin", "--batch_sizes=1")
    self.assertEqual(point["same_tokens"], 1.0)
    self.assertGreater(point["draft_step_ms"], 0.0)

  def test_tiny_run(self):
    point = _run("--batch_sizes=2")
    self.assertEqual((point["batch_size"], point["gamma"]), (2, _GAMMA))
    self.assertEqual(point["same_tokens"], 1.0)
    self.assertEqual(point["iterations"], _DECODE_LEN // (_GAMMA + 1))
    self.assertEqual(point["tokens_per_target_call"], _GAMMA + 1)
    calls = point["verify_ms"] + point["draft_chunk_ms"]
    calls += (_GAMMA - 1) * point["draft_step_ms"]
    self.assertAlmostEqual(point["speculative_calls_ms"], calls, places=9)
    self.assertAlmostEqual(
        point["speculative_iteration_over_calls"],
        point["speculative_iteration_ms"] / calls,
        places=9,
    )
    self.assertAlmostEqual(
        point["speculative_iteration_ms"] * point["iterations"],
        point["speculative_ms_per_token"] * _DECODE_LEN,
        places=9,
    )
    self.assertAlmostEqual(
        point["baseline_iteration_over_step"],
        point["baseline_ms_per_token"] / point["step_ms"],
        places=9,
    )
    self.assertAlmostEqual(
        point["speculative_iteration_over_sequence"],
        point["speculative_iteration_ms"] / point["call_sequence_ms"],
        places=9,
    )
    self.assertGreater(point["call_sequence_ms"], 0.0)
    self.assertAlmostEqual(
        point["c"], point["draft_step_ms"] / point["step_ms"], places=12
    )


if __name__ == "__main__":
  absltest.main()
