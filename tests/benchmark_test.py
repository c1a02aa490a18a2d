"""spec_decode.benchmark: a tiny Table 2 sweep end to end, and its errors.

The demo's 1.9M-parameter draft stands in as the target, with unigram and
bigram drafts, so that the sweep compiles and decodes real Multi30k test
sentences in seconds.
"""

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
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

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_DEMO = _ROOT / "spec_decode" / "demo"
_VOCABULARY = _DEMO / "sentencepiece.model"
_GAMMAS = (1, 2)
_DRAFTS = ("unigram", "bigram")
_NUM_EXAMPLES = 3
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


class BenchmarkTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = pathlib.Path(tempfile.mkdtemp())
    cls.out = cls.tmp / "out"
    cls.gin_file = cls.tmp / "tiny.gin"
    cls.gin_file.write_text(f"""
include 'target:models/demo_draft.gin'
target/checkpoint_path.path = '{_DEMO / "draft"}'
run.vocabulary = @seqio.SentencePieceVocabulary()
seqio.SentencePieceVocabulary.sentencepiece_model_file = '{_VOCABULARY}'
seqio.SentencePieceVocabulary.extra_ids = 96
run.gamma = 1
run.max_input_len = 64
run.max_decode_len = 24
run.timing_repeats = 1
make_mesh.num_devices = 1
table2.sweep.output_dir = '{cls.out}'
table2.sweep.tasks = {{'multi30k_en_de': []}}
table2.sweep.drafts = {list(_DRAFTS)}
table2.sweep.temperatures = [0.0]
table2.sweep.gammas = {list(_GAMMAS)}
table2.sweep.batch_sizes = [1]
table2.sweep.num_examples = {_NUM_EXAMPLES}
table2.sweep.ngram_corpus = '{_DEMO / "multi30k" / "test_2016_flickr.de.gz"}'
table2.sweep.progress = False
""")
    gin_config.parse([cls.gin_file])
    cls.written = []  # The points in each table written, as it is written.
    write = table2.write

    def counting_write(directory, everything):
      cls.written.append(len(everything["points"]))
      return write(directory, everything)

    with mock.patch.object(table2, "write", counting_write):
      cls.markdown = table2.sweep([cls.gin_file], [])
    gin.clear_config()

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

  def tearDown(self):
    gin.clear_config()
    super().tearDown()


if __name__ == "__main__":
  absltest.main()
