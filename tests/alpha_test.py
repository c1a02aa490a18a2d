"""Tests for the spec_decode.alpha command line (logic: teacher_forced.py)."""

import json
import pathlib
import subprocess
import sys
import tempfile

from absl.testing import absltest

_REPO = pathlib.Path(__file__).resolve().parent.parent
# The demo target as its own draft: p = q everywhere, so alpha is exactly 1.
_SELF_DRAFT = [
    "--gin_bindings=include 'draft:models/demo_target.gin'",
    "--gin_bindings=draft/checkpoint_path.path = 'spec_decode/demo/target'",
    "--gin_bindings=target/checkpoint_path.path = 'spec_decode/demo/target'",
    "--gin_bindings=include 'target:models/demo_target.gin'",
]


def _alpha(*args):
  return subprocess.run(
      [
          sys.executable,
          "-m",
          "spec_decode.alpha",
          "--gin_file=configs/demo.gin",
          "--gin_bindings=read_inputs.num_examples = 6",
          "--batch_size=4",
          *args,
      ],
      capture_output=True,
      text=True,
      check=False,
      cwd=_REPO,
  )


class AlphaCliTest(absltest.TestCase):

  def test_a_draft_equal_to_the_target_has_alpha_1(self):
    tmp = pathlib.Path(tempfile.mkdtemp())
    done = _alpha(*_SELF_DRAFT, f"--output={tmp / 'alpha.json'}")
    self.assertEqual(done.returncode, 0, done.stderr[-2000:])
    rows = [line.split() for line in done.stdout.splitlines()[-2:]]
    self.assertEqual(
        [row[:3] for row in rows],
        [["0", "1.000", "0.0000"], ["1", "1.000", "0.0000"]],
    )
    # Eq. 1 at alpha 1: gamma + 1 tokens per call.
    self.assertEqual(rows[0][-8:], [f"{g + 1:.2f}" for g in range(1, 9)])
    records = json.loads((tmp / "alpha.json").read_text())
    self.assertEqual([r["temperature"] for r in records], [0.0, 1.0])
    self.assertEqual([r["sentences"] for r in records], [6, 6])
    for record in records:
      self.assertAlmostEqual(record["alpha"], 1.0, places=6)

  def test_references_are_scored_instead_of_samples(self):
    tmp = pathlib.Path(tempfile.mkdtemp())
    references = tmp / "refs.de"
    references.write_text("Ein Hund.\nZwei Katzen spielen.\n" * 3)
    done = _alpha(
        f"--references={references}",
        "--temperatures=1",
        f"--output={tmp / 'alpha.json'}",
    )
    self.assertEqual(done.returncode, 0, done.stderr[-2000:])
    (record,) = json.loads((tmp / "alpha.json").read_text())
    # The same 6 short references at any seed: their token count, EOS
    # included, is what was scored.
    self.assertEqual(record["sentences"], 6)
    self.assertBetween(record["alpha"], 0.05, 0.99)
    again = _alpha(
        f"--references={references}",
        "--temperatures=1",
        "--seed=7",
        f"--output={tmp / 'again.json'}",
    )
    (same,) = json.loads((tmp / "again.json").read_text())
    self.assertEqual(same, record)

  def test_too_few_references_is_one_line(self):
    tmp = pathlib.Path(tempfile.mkdtemp())
    references = tmp / "refs.de"
    references.write_text("Ein Hund.\n")
    done = _alpha(f"--references={references}")
    self.assertEqual(done.returncode, 1)
    self.assertEqual(
        done.stderr.strip().splitlines()[-1],
        "error: --references has 1 lines, fewer than the 6 inputs",
    )

  def test_bad_flags_fail_before_the_measurement(self):
    tmp = pathlib.Path(tempfile.mkdtemp())
    for flags, error in (
        (
            [f"--output={tmp / 'no_dir' / 'alpha.json'}"],
            f"error: --output {tmp / 'no_dir' / 'alpha.json'} cannot be "
            f"written: No such file or directory: {tmp / 'no_dir'}",
        ),
        (
            ["--temperatures=0,hot"],
            "error: --temperatures: 'hot' is not a number >= 0 (e.g. "
            "--temperatures=0,1)",
        ),
        (
            ["--temperatures=1,-0.5"],
            "error: --temperatures: '-0.5' is not a number >= 0 (e.g. "
            "--temperatures=0,1)",
        ),
        (  # Checked before the gin files are parsed (seqio, TensorFlow).
            ["--temperatures=nan", "--gin_file=missing.gin"],
            "error: --temperatures: 'nan' is not a number >= 0 (e.g. "
            "--temperatures=0,1)",
        ),
    ):
      with self.subTest(flags=flags):
        done = _alpha(*flags)
        self.assertEqual(done.returncode, 1)
        self.assertEqual(done.stderr.splitlines(), [error])

  def test_a_draft_kind_it_cannot_score_is_one_line(self):
    done = _alpha("--gin_bindings=run.draft = 'target'")
    self.assertEqual(done.returncode, 1)
    self.assertIn(
        "error: run.draft='target': spec_decode.alpha scores a 't5', "
        "'unigram', 'bigram' or 'lookup' draft",
        done.stderr,
    )


if __name__ == "__main__":
  absltest.main()
