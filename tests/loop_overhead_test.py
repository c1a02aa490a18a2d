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


def _command(output, *flags):
  return [
      sys.executable,
      str(_ROOT / "benchmarks" / "loop_overhead.py"),
      f"--gammas={_GAMMA}",
      f"--max_decode_len={_DECODE_LEN}",
      "--rounds=1",
      "--calls=2",
      "--input_len=4",
      f"--output={output}",
      *flags,
  ]


def _run(*flags):
  """Runs the script with one timed round and reads its one point."""
  with tempfile.TemporaryDirectory() as tmp:
    output = pathlib.Path(tmp) / "loop_overhead.json"
    subprocess.run(
        _command(output, *flags), check=True, capture_output=True, cwd=_ROOT
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

  def test_sentences_stop_at_eos(self):
    # The demo's first three test sentences, EOS on, up to 64 tokens: the
    # target's greedy translations have 20, 16 and 19 tokens, EOS included
    # (192 if EOS were ignored).
    point = _run(
        "--gin_file=configs/demo_shared.gin",
        "--batch_sizes=1",
        "--sentences=3",
        "--max_decode_len=64",
    )
    self.assertEqual((point["sentences"], point["batch_size"]), (3, 1))
    self.assertEqual(point["same_tokens"], 1.0)
    self.assertEqual(point["steps"], 20 + 16 + 19)
    # At batch 1 every iteration is one target call of the row's.
    self.assertAlmostEqual(
        point["tokens_per_target_call"] * point["iterations"],
        point["steps"],
        places=9,
    )
    self.assertAlmostEqual(
        point["speculative_iteration_ms"] * point["iterations"],
        point["speculative_ms_per_token"] * point["steps"],
        places=9,
    )

  def test_sentences_need_a_run_config(self):
    with tempfile.TemporaryDirectory() as tmp:
      result = subprocess.run(
          _command(pathlib.Path(tmp) / "out.json", "--sentences=2"),
          capture_output=True,
          text=True,
          cwd=_ROOT,
      )
    self.assertNotEqual(result.returncode, 0)
    self.assertIn("--sentences takes a count", result.stderr)
    self.assertNotIn("Traceback", result.stderr)

  def test_tiny_run(self):
    point = _run("--batch_sizes=2")
    self.assertEqual((point["batch_size"], point["gamma"]), (2, _GAMMA))
    self.assertEqual(point["same_tokens"], 1.0)
    self.assertEqual(point["iterations"], _DECODE_LEN // (_GAMMA + 1))
    self.assertEqual(point["steps"], _DECODE_LEN)
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
