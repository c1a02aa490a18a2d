"""spec_decode.benchmark: the Table 2 sweep's axes, and its errors.

The full sweep's 192 points, the verifier, draft threshold and gamma policy
axes on small sweeps of their own, and the bad bindings, axes and points that
fail in one line or before any point runs.
"""

import json
import subprocess
import sys
from unittest import mock

from absl.testing import absltest
import gin

from spec_decode import compare
from spec_decode import gin_config
from spec_decode import table2
from spec_decode import vocabulary  # pylint: disable=unused-import  (gin)

import tiny_table2

_ROOT = tiny_table2.ROOT


class Table2AxesTest(tiny_table2.TinyTable2TestCase):

  def _cli(self, *bindings):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "spec_decode.benchmark",
            f"--gin_file={self.gin_file}",
        ]
        + [f"--gin_bindings={b}" for b in bindings],
        capture_output=True,
        text=True,
        check=False,
        cwd=_ROOT,
    )

  def test_the_full_sweep_is_192_points(self):
    gin_config.parse(["benchmark.gin"])
    axes = {
        name: gin.query_parameter(f"table2.sweep.{name}")
        for name in ("tasks", "temperatures", "batch_sizes", "drafts", "gammas")
    }
    self.assertEqual(set(axes["tasks"]), {"multi30k_en_de", "wmt21_en_de"})
    self.assertLen(table2.points(**axes), 192)

  def test_bad_binding_is_one_line(self):
    done = self._cli("table2.sweep.gamas = [1]")
    self.assertEqual(done.returncode, 1)
    self.assertEqual(done.stdout, "")
    lines = done.stderr.strip().splitlines()
    self.assertLen(lines, 1, done.stderr)
    self.assertRegex(lines[0], r"^error: .*gamas")

  def test_failing_point_is_named(self):
    gin_config.parse([self.gin_file], ["run.max_input_len = 4"])
    with self.assertRaisesRegex(
        RuntimeError,
        r"^point 1/4 \(multi30k_en_de, temperature 0, batch 1, unigram draft, "
        r"gamma 1\): input 1 has \d+ tokens",
    ):
      table2.sweep(
          [self.gin_file],
          ["run.max_input_len = 4"],
          output_dir=self.tmp / "failing",
      )

  def test_bad_axis_fails_before_any_point(self):
    with self.assertRaisesRegex(ValueError, "drafts: 'trigram' is not one of"):
      table2.sweep(
          [self.gin_file],
          [],
          output_dir=self.tmp / "bad",
          tasks={"multi30k_en_de": []},
          drafts=["trigram"],
      )
    self.assertFalse((self.tmp / "bad").exists())

  def test_output_dir_that_cannot_be_made_is_one_line(self):
    (self.tmp / "a_file").write_text("")
    with self.assertRaisesRegex(
        ValueError,
        f"(?m)^table2.sweep.output_dir {self.tmp / 'a_file' / 'out'} is not "
        "writable: Not a directory$",  # gin adds a line.
    ):
      table2.sweep(
          [self.gin_file],
          [],
          output_dir=self.tmp / "a_file" / "out",
          tasks={"multi30k_en_de": []},
      )

  def test_verifier_and_threshold_axes(self):
    gin_config.parse([self.gin_file])
    table2.sweep(
        [self.gin_file],
        [],
        output_dir=self.tmp / "policies",
        drafts=["bigram"],
        gammas=[2],
        verifiers=["token", "block"],
        draft_thresholds=[0.0, 0.5],
    )
    rows = json.loads((self.tmp / "policies" / "table2.json").read_text())[
        "points"
    ]
    self.assertEqual(
        [(r["verifier"], r["draft_threshold"]) for r in rows],
        [
            (verifier, threshold)
            for verifier in ("token", "block")
            for threshold in (0.0, 0.5)
        ],
    )
    for row in rows:
      self.assertEqual(row["mismatches"], 0)
      self.assertEqual((row["gamma"], row["gamma_policy"]), (2, "fixed"))
      self.assertIsNone(row["calibration"])
      if row["draft_threshold"] == 0:
        self.assertEqual(row["draft_calls_per_target_call"], 2)
      else:
        self.assertLessEqual(row["draft_calls_per_target_call"], 2)

  def test_gamma_policy_axis(self):
    # One 'auto' point: its calibration compiles 8 verify calls.
    axes = dict(
        drafts=["bigram"],
        gammas=[2, "auto"],
        verifiers=["block"],
        draft_thresholds=[0.5],
    )
    gin_config.parse([self.gin_file])
    markdown = table2.sweep(
        [self.gin_file], [], output_dir=self.tmp / "auto", **axes
    )
    rows = json.loads((self.tmp / "auto" / "table2.json").read_text())["points"]
    self.assertEqual([r["gamma_policy"] for r in rows], ["fixed", "auto"])
    fixed, auto = rows
    self.assertEqual(fixed["gamma"], 2)
    self.assertIsNone(fixed["calibration"])
    self.assertBetween(auto["gamma"], 1, 8)
    self.assertEqual(auto["calibration"]["gamma"], auto["gamma"])
    self.assertLen(auto["calibration"]["verify_calls"], 8)
    for row in rows:
      self.assertEqual(row["mismatches"], 0)
      self.assertLessEqual(row["draft_calls_per_target_call"], row["gamma"])
    self.assertIn("| auto (", markdown)
    self.assertIn("| block, stop < 0.5 |", markdown)
    # Resuming keeps every point, 'auto' ones included.
    gin_config.parse([self.gin_file])
    with mock.patch.object(compare, "run", side_effect=AssertionError):
      table2.sweep(
          [self.gin_file],
          [],
          output_dir=self.tmp / "auto",
          resume=True,
          **axes,
      )

  def test_bad_verifier_axis_fails_before_any_point(self):
    for axes, message in (
        (dict(verifiers=["tree"]), "verifiers: 'tree' is not one of"),
        (dict(draft_thresholds=[1.0]), "draft_thresholds must be in"),
        (dict(gammas=["best"]), "gammas must be ints >= 1 or 'auto'"),
        # Not a TypeError from comparing a string.
        (dict(temperatures=["hot"]), "temperatures must be >= 0: \\['hot'\\]"),
        (dict(draft_thresholds=["0.5"]), "draft_thresholds must be in"),
        # A bool is an int to Python: these were batch 1 and gamma 1.
        (dict(batch_sizes=[True]), "batch_sizes must be ints >= 1"),
        (dict(gammas=[True]), "gammas must be ints >= 1 or 'auto'"),
        (dict(num_examples=True), "num_examples must be an int >= 1"),
        # Any string was true: the sweep resumed.
        (dict(resume="False"), "resume must be True or False, got 'False'"),
        (dict(progress="no"), "progress must be True or False, got 'no'"),
    ):
      with self.assertRaisesRegex(ValueError, message):
        table2.sweep(
            [self.gin_file],
            [],
            output_dir=self.tmp / "bad_policy",
            tasks={"multi30k_en_de": []},
            **axes,
        )
    self.assertFalse((self.tmp / "bad_policy").exists())


if __name__ == "__main__":
  absltest.main()
