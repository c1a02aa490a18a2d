"""spec_decode.benchmark: one tiny Table 2 sweep end to end, and what uses it.

The sweep runs once, for the class: its table2.json against the golden file,
its markdown and plot, the table written after each group, and the merge of
its parts and the resume of its directory.
"""

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
from unittest import mock

from absl.testing import absltest
import gin
from matplotlib import image

from spec_decode import analysis
from spec_decode import compare
from spec_decode import data
from spec_decode import gin_config
from spec_decode import table2
from spec_decode import vocabulary  # pylint: disable=unused-import  (gin)

import tiny_table2

_ROOT = tiny_table2.ROOT
_DEMO = tiny_table2.DEMO
_GAMMAS = tiny_table2.GAMMAS
_DRAFTS = tiny_table2.DRAFTS
_NUM_EXAMPLES = tiny_table2.NUM_EXAMPLES
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_GOLDEN = pathlib.Path(__file__).parent / "testdata" / "golden_table2.json"
_GOLDEN_KEYS = (
    "alpha",
    "alpha_estimate",
    "tokens_per_target_call",
    "target_calls",
    "speculative_tokens",
    "baseline_tokens",
)


class Table2SweepTest(tiny_table2.TinyTable2TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    gin_config.parse([cls.gin_file])
    cls.written = []  # The points in each table written, as it is written.
    write = table2.write

    def counting_write(directory, everything):
      cls.written.append(len(everything["points"]))
      return write(directory, everything)

    with mock.patch.object(table2, "write", counting_write):
      cls.markdown = table2.sweep([cls.gin_file], [])
    gin.clear_config()

  def test_json_has_every_point(self):
    everything = json.loads((self.out / "table2.json").read_text())
    points = everything["points"]
    self.assertEqual(
        [(p["draft"], p["gamma"]) for p in points],
        [(d, g) for d in _DRAFTS for g in _GAMMAS],
    )
    for point in points:
      gamma = point["gamma"]
      self.assertEqual(point["task"], "multi30k_en_de")
      self.assertEqual(point["split"], "test")
      self.assertEqual(point["num_examples"], _NUM_EXAMPLES)
      self.assertEqual(point["batch_size"], 1)
      self.assertEqual(point["mismatches"], 0)
      self.assertBetween(point["alpha"], 0.0, 1.0)
      self.assertBetween(point["tokens_per_target_call"], 1.0, gamma + 1)
      self.assertGreater(point["speedup"], 0.0)
      self.assertAlmostEqual(
          point["predicted_speedup"],
          analysis.walltime_improvement(point["alpha"], gamma, point["c"]),
      )
      self.assertEqual(
          point["optimal_gamma"],
          analysis.optimal_gamma(point["alpha"], point["c"]),
      )
      results = json.loads(
          (
              self.out / "points" / f"multi30k_en_de-T0-b1-{point['draft']}-"
              f"g{gamma}" / "results.json"
          ).read_text()
      )
      self.assertEqual(results["speedup"], point["speedup"])
    self.assertEqual(
        [(b["draft"], b["temperature"]) for b in everything["best_gammas"]],
        [(d, 0.0) for d in _DRAFTS],
    )
    for best in everything["best_gammas"]:
      point = next(
          p
          for p in points
          if p["draft"] == best["draft"]
          and p["gamma"] == best["measured_gamma"]
      )
      self.assertEqual(best["measured_speedup"], point["speedup"])
      self.assertAlmostEqual(
          best["call_cost_speedup"],
          point["tokens_per_target_call"]
          * point["target_step_ms"]
          / (
              best["measured_gamma"] * point["draft_step_ms"]
              + point["target_verify_ms"]
          ),
          places=12,
      )
      self.assertIn(best["measured_gamma"], _GAMMAS)
      self.assertIn(best["predicted_gamma"], _GAMMAS)
      self.assertGreaterEqual(best["optimal_gamma"], 1)

  def test_greedy_points_equal_the_golden_file(self):
    # Exact counts for fixed inputs, written once with
    # SPEC_DECODE_WRITE_GOLDEN=1 and reviewed by hand.
    points = json.loads((self.out / "table2.json").read_text())["points"]
    got = [
        dict(
            draft=p["draft"],
            gamma=p["gamma"],
            **{key: p[key] for key in _GOLDEN_KEYS},
        )
        for p in points
    ]
    for point in got:  # Greedy: beta is 1 exactly where the draft matched.
      self.assertAlmostEqual(point["alpha"], point["alpha_estimate"], places=9)
    if os.environ.get("SPEC_DECODE_WRITE_GOLDEN"):
      _GOLDEN.write_text(json.dumps(got, indent=2) + "\n")
    self.assertEqual(got, json.loads(_GOLDEN.read_text()))

  def test_markdown_has_a_row_per_point(self):
    self.assertEqual((self.out / "table2.md").read_text(), self.markdown)
    tables = [
        [line for line in block.splitlines() if line.startswith("| ")]
        for block in self.markdown.split("## ")[1:]
    ]
    points, best = tables
    self.assertLen(points, 1 + len(_DRAFTS) * len(_GAMMAS))  # With a header.
    self.assertLen(best, 1 + len(_DRAFTS))
    self.assertStartsWith(points[1], "| multi30k_en_de | 0 | 1 | unigram | 1 |")
    self.assertIn("differing from the baseline: 0 over 4 greedy", self.markdown)

  def test_the_table_is_written_after_each_group(self):
    # One group per draft: a stopped sweep keeps the groups it finished.
    self.assertEqual(
        self.written, [len(_GAMMAS) * n for n in range(1, len(_DRAFTS) + 1)]
    )

  def _parts(self):
    """The sweep's table2.json cut in two, by draft, as two sweeps'."""
    everything = json.loads((self.out / "table2.json").read_text())
    paths = []
    for draft in _DRAFTS:
      rows = [p for p in everything["points"] if p["draft"] == draft]
      part = dict(everything, points=rows, best_gammas=table2.best_gammas(rows))
      path = self.tmp / f"part_{draft}.json"
      path.write_text(json.dumps(part))
      paths.append(path)
    return everything, paths

  def test_merge_rebuilds_the_table_from_parts(self):
    everything, paths = self._parts()
    merged_dir = self.tmp / "merged"
    text = table2.merge(paths, merged_dir)
    self.assertEqual(text, self.markdown)
    merged = json.loads((merged_dir / "table2.json").read_text())
    self.assertEqual(merged["points"], everything["points"])
    self.assertEqual(merged["best_gammas"], everything["best_gammas"])
    self.assertEqual(
        merged["parts"],
        [
            dict(
                source=str(path),
                files=everything["files"],
                bindings=everything["bindings"],
                num_points=len(_GAMMAS),
            )
            for path in paths
        ],
    )
    self.assertEqual(
        (merged_dir / "table2.png").read_bytes()[:8], _PNG_SIGNATURE
    )
    # A merge of merges keeps the parts.
    again = table2.merge([merged_dir / "table2.json"], self.tmp / "again")
    self.assertEqual(again, self.markdown)
    self.assertEqual(
        json.loads((self.tmp / "again" / "table2.json").read_text())["parts"],
        merged["parts"],
    )

  def test_merge_rejects_bad_parts(self):
    path = self.out / "table2.json"
    with self.assertRaisesRegex(
        ValueError,
        r"^multi30k_en_de, temperature 0, batch 1, unigram draft, gamma 1 is "
        r"in both .*table2.json and .*table2.json$",
    ):
      table2.merge([path, path], self.tmp / "twice")
    not_a_table = self.tmp / "results.json"
    not_a_table.write_text('{"alpha": 0.5}')
    with self.assertRaisesRegex(ValueError, r"results.json has no Table 2"):
      table2.merge([not_a_table], self.tmp / "not_a_table")

  def test_merge_cli(self):
    _, paths = self._parts()
    merged_dir = self.tmp / "merged_cli"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "spec_decode.benchmark",
            f"--merge={paths[0]},{paths[1]}",
            f"--merge_dir={merged_dir}",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=_ROOT,
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertEqual(done.stdout, self.markdown + "\n")
    self.assertEqual((merged_dir / "table2.md").read_text(), self.markdown)
    done = subprocess.run(
        [sys.executable, "-m", "spec_decode.benchmark", f"--merge={paths[0]}"],
        capture_output=True,
        text=True,
        check=False,
        cwd=_ROOT,
    )
    self.assertEqual(done.returncode, 1)
    self.assertEqual(done.stderr.strip(), "error: --merge needs --merge_dir")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "spec_decode.benchmark",
            f"--merge={paths[0]}",
            f"--merge_dir={merged_dir}",
            f"--gin_file={self.gin_file}",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=_ROOT,
    )
    self.assertEqual(done.returncode, 1)
    self.assertEqual(
        done.stderr.strip(),
        "error: --merge takes no gin flags and no arguments",
    )

  @contextlib.contextmanager
  def _resuming(self):
    """The sweep's own directory (its points' bindings name that path), put
    back as it was afterwards for the other tests."""
    backup = self.tmp / "backup"
    shutil.copytree(self.out, backup)
    try:
      yield self.out
    finally:
      shutil.rmtree(self.out)
      backup.rename(self.out)

  def test_resume_keeps_every_finished_point(self):
    gin_config.parse([self.gin_file])
    with self._resuming() as directory, mock.patch.object(
        compare, "run", side_effect=AssertionError("a point ran again")
    ):
      text = table2.sweep(
          [self.gin_file], [], output_dir=directory, resume=True
      )
    self.assertEqual(text, self.markdown)

  def test_resume_runs_only_new_points(self):
    gin_config.parse([self.gin_file])
    with self._resuming() as directory, mock.patch.object(
        compare, "run", wraps=compare.run
    ) as run:
      before = json.loads((directory / "table2.json").read_text())["points"]
      table2.sweep(
          [self.gin_file],
          [],
          output_dir=directory,
          gammas=[*_GAMMAS, 3],
          resume=True,
      )
      after = json.loads((directory / "table2.json").read_text())["points"]
    self.assertEqual(run.call_count, len(_DRAFTS))
    self.assertEqual(
        [(p["draft"], p["gamma"]) for p in after],
        [(d, g) for d in _DRAFTS for g in (*_GAMMAS, 3)],
    )
    self.assertEqual([p for p in after if p["gamma"] != 3], before)

  def test_resume_refuses_another_setting(self):
    # Another n-gram corpus: the first 100 lines of the same file.
    corpus = self.tmp / "short_corpus.txt"
    corpus.write_text(
        "\n".join(
            data.read_lines(_DEMO / "multi30k" / "test_2016_flickr.de.gz")[:100]
        )
    )
    message = (
        r"^cannot resume from .*out/table2.json: it was run with other gin "
        "files, bindings or n-gram corpus"
    )
    with self._resuming() as directory:
      corpus_before = (directory / "ngram_corpus.txt").read_text()
      for bindings, changes in (
          (["run.max_decode_len = 20"], {}),
          ([], {"ngram_corpus": str(corpus)}),
      ):
        gin_config.parse([self.gin_file], bindings)
        with self.assertRaisesRegex(ValueError, message):
          table2.sweep(
              [self.gin_file],
              bindings,
              output_dir=directory,
              resume=True,
              **changes,
          )
      # Refused before anything was written.
      self.assertEqual(
          (directory / "ngram_corpus.txt").read_text(), corpus_before
      )

  def test_plot_is_a_png(self):
    path = self.out / "table2.png"
    self.assertEqual(path.read_bytes()[:8], _PNG_SIGNATURE)
    height, width, _ = image.imread(path).shape
    self.assertGreater(height, 100)
    self.assertGreater(width, 100)


if __name__ == "__main__":
  absltest.main()
