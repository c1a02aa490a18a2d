"""No silent garbage, no lost work, for a whole run (issue 14): compare.run
and the CLIs on a tiny pair stop on non-finite target logits, keep the rows
they decoded, replace results atomically, and fail with one-line errors.

The other tests of issue 14 are in logits_test.py (non-finite logits in the
decoding loops), checkpoint_integrity_test.py and offline_test.py.
"""

import contextlib
import io
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from flax import traverse_util
import gin
import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm

import run_test
import tiny_pair
from spec_decode import cli
from spec_decode import compare
from spec_decode import gin_config
from spec_decode import inputs as inputs_lib
from spec_decode import optimizers
from spec_decode import run_outputs
from spec_decode import vocabulary  # pylint: disable=unused-import  (gin)
from spec_decode.models import t5

_VOCAB = tiny_pair.VOCAB
_GAMMA = 3
_save_t5x = run_test._save_t5x_checkpoint  # pylint: disable=protected-access
_TARGET = tiny_pair.TARGET
_DRAFT = tiny_pair.DRAFT


class RunTest(parameterized.TestCase):
  """compare.run and the CLIs on a tiny pair."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = pathlib.Path(tempfile.mkdtemp())
    words = "a dog runs in the park . two men play on green grass .".split()
    lines = [" ".join(words[i % 7 : i % 7 + 5]) for i in range(100)]
    (cls.tmp / "corpus.txt").write_text("\n".join(lines))
    spm.SentencePieceTrainer.train(
        input=str(cls.tmp / "corpus.txt"),
        model_prefix=str(cls.tmp / "spm"),
        vocab_size=25,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        minloglevel=2,
    )
    for name, config, seed in (("target", _TARGET, 0), ("draft", _DRAFT, 1)):
      (cls.tmp / f"{name}.gin").write_text(
          run_test._tiny_model_gin(  # pylint: disable=protected-access
              _VOCAB, config.emb_dim, config.num_decoder_layers
          )
      )
      params = t5.init_params(config, jax.random.key(seed))
      _save_t5x(params, cls.tmp / f"{name}_ckpt")
      if name == "target":
        # Finite weights whose logits overflow float32.
        params["decoder"]["logits_dense"]["kernel"] = jnp.sign(
            params["decoder"]["logits_dense"]["kernel"]
        ) * jnp.float32(3e38)
        _save_t5x(params, cls.tmp / "overflow_ckpt")
    (cls.tmp / "inputs.txt").write_text("\n".join(lines[:5]))
    cls.run_gin = cls.tmp / "run.gin"
    cls.run_gin.write_text(run_test.run_gin_text(cls.tmp, num_devices=1))

  def tearDown(self):
    gin.clear_config()
    super().tearDown()

  def _run(self, *bindings):
    gin_config.parse([self.run_gin], bindings)
    return compare.run()

  def _cli(self, *args, module="spec_decode.run"):
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=pathlib.Path(__file__).resolve().parent.parent,
    )

  def _out(self, name):
    return f"run.output_dir = '{self.tmp / name}'"

  # Non-finite logits.

  def test_overflowing_target_stops_the_run_with_the_count(self):
    overflow = f"target/checkpoint_path.path = '{self.tmp}/overflow_ckpt'"
    with self.assertRaisesRegex(
        ValueError,
        r"^2 of the 2 rows decoded so far had NaN or infinite target logits"
        r".*set run.allow_nonfinite = True",
    ):
      self._run(self._out("nonfinite"), overflow)
    rows = (self.tmp / "nonfinite" / "outputs.jsonl").read_text().splitlines()
    self.assertEqual([json.loads(r)["nonfinite"] for r in rows], [True] * 2)
    results = self._run(
        self._out("nonfinite"), overflow, "run.allow_nonfinite = True"
    )
    self.assertEqual(results["nonfinite_rows"], 5)

  # Per-position acceptance (vLLM's definitions).

  def test_acceptance_by_position_and_mean_accepted_length(self):
    results = self._run(self._out("positions"), "run.temperature = 1.0")
    rates = np.asarray(results["acceptance_rate_by_position"])
    self.assertLen(rates, _GAMMA)
    # Position i is accepted only after 1..i-1 were: the rates fall.
    self.assertTrue(np.all(np.diff(rates) <= 0), rates)
    self.assertBetween(rates[0], 0.0, 1.0)
    self.assertAlmostEqual(
        rates.sum() * results["target_calls"],
        results["accepted_tokens"],
        places=6,
    )
    self.assertAlmostEqual(results["mean_accepted_length"], 1 + rates.sum())
    saved = json.loads((self.tmp / "positions" / "results.json").read_text())
    self.assertEqual(saved["acceptance_rate_by_position"], list(rates))

  # No lost work.

  def test_unwritable_output_dir_fails_before_loading_anything(self):
    blocker = self.tmp / "a_file"
    blocker.write_text("")
    with mock.patch.object(
        compare.pair, "load_model", side_effect=AssertionError("loaded")
    ):
      with self.assertRaisesRegex(
          ValueError, f"^run.output_dir {blocker}/out is not writable"
      ):
        self._run(f"run.output_dir = '{blocker}/out'")

  def test_interrupted_run_keeps_the_rows_it_decoded(self):
    out = self.tmp / "interrupted"
    out.mkdir()
    (out / "results.json").write_text('{"stale": true}')
    trim = inputs_lib.trim
    calls = []

    def trim_then_stop(batch):
      calls.append(1)
      if len(calls) == 3:  # The third batch of 2 rows.
        raise KeyboardInterrupt
      return trim(batch)

    with mock.patch.object(compare.inputs_lib, "trim", trim_then_stop):
      with self.assertRaises(KeyboardInterrupt) as caught:
        self._run(f"run.output_dir = '{out}'")
    self.assertEqual(
        caught.exception.args,
        (f"after 4 of 5 inputs; their outputs are in {out}/outputs.jsonl",),
    )
    rows = [json.loads(r) for r in (out / "outputs.jsonl").open()]
    self.assertLen(rows, 4)
    self.assertTrue(all(row["identical"] for row in rows))
    # No stale report beside the new outputs.
    self.assertFalse((out / "results.json").exists())

  def test_interrupted_before_any_row_says_so(self):
    writer = run_outputs.Writer(self.tmp / "no_rows")
    self.assertEqual(
        writer.interrupted(5),
        f"before the first batch ended; {self.tmp / 'no_rows'} holds no "
        "outputs",
    )

  def test_ctrl_c_is_one_line_with_status_130(self):
    for interrupt, line in (
        (
            KeyboardInterrupt("after 4 of 5 inputs"),
            "interrupted after 4 of 5 inputs",
        ),
        (KeyboardInterrupt(), "interrupted"),
    ):
      stderr = io.StringIO()
      with contextlib.redirect_stderr(stderr):
        with self.assertRaises(SystemExit) as caught:
          with cli.one_line_errors():
            raise interrupt
      self.assertEqual(caught.exception.code, 130)
      self.assertEqual(stderr.getvalue(), line + "\n")

  def test_results_json_is_replaced_atomically(self):
    path = self.tmp / "atomic.json"
    path.write_text("old\n")
    with mock.patch.object(os, "replace", side_effect=OSError("disk full")):
      with self.assertRaises(OSError):
        run_outputs.write_atomically(path, "new\n")
    self.assertEqual(path.read_text(), "old\n")
    self.assertEqual(
        sorted(p.name for p in self.tmp.glob("atomic*")), [path.name]
    )
    run_outputs.write_atomically(path, "new\n")
    self.assertEqual(path.read_text(), "new\n")
    self.assertEqual(path.stat().st_mode & 0o777, 0o644)

  def test_cli_says_where_results_went_and_that_they_replaced_others(self):
    out = self.tmp / "cli"
    args = [
        f"--gin_file={self.run_gin}",
        f"--gin_bindings=run.output_dir = '{out}'",
        "--gin_bindings=run.progress = True",
    ]
    first = self._cli(*args)
    self.assertEqual(first.returncode, 0, first.stderr)
    self.assertIn(
        f"results in {out}/: results.json, outputs.jsonl, config.gin\n",
        first.stdout,
    )
    second = self._cli(*args)
    self.assertIn("(earlier results there replaced)", second.stdout)
    self.assertIn(
        "rows with non-finite logits                   0", second.stdout
    )

  # One-line errors.

  @parameterized.named_parameters(
      (
          "gamma_over_max_decode_len",
          "run.gamma = 13",
          r"^run.gamma 13 exceeds " r"run.max_decode_len 12",
      ),
      (
          "missing_ngram_corpus",
          "run.draft = 'bigram'\nrun.ngram_corpus = "
          "'/nonexistent/corpus.txt'",
          "^run.ngram_corpus: no such file: " "/nonexistent/corpus.txt",
      ),
  )
  def test_bad_run_arguments(self, binding, message):
    with self.assertRaisesRegex(ValueError, message):
      self._run(self._out("bad"), binding)

  def test_non_utf8_files_are_named(self):
    latin1 = self.tmp / "latin1.txt"
    latin1.write_bytes("ein Hund läuft\n".encode("latin-1"))
    with self.assertRaisesRegex(
        ValueError, f"^read_inputs.path: {latin1} is not UTF-8 text"
    ):
      self._run(self._out("bad"), f"read_inputs.path = '{latin1}'")
    with self.assertRaisesRegex(
        ValueError, f"^run.ngram_corpus: {latin1} is not UTF-8 text"
    ):
      self._run(
          self._out("bad"),
          "run.draft = 'unigram'",
          f"run.ngram_corpus = '{latin1}'",
      )

  def test_missing_gin_file_under_configs(self):
    done = self._cli("--gin_file=configs/no_such_run.gin")
    self.assertEqual(done.returncode, 1)
    self.assertEqual(
        done.stderr.strip().splitlines(),
        [
            "error: gin file configs/no_such_run.gin not found (looked in "
            f"the working directory and in {gin_config.CONFIG_DIR})"
        ],
    )

  def test_gin_syntax_error_shows_file_line_and_caret(self):
    bad = self.tmp / "syntax.gin"
    bad.write_text("run.gamma = 4\nrun.batch_size = = 2\n")
    done = self._cli(f"--gin_file={bad}")
    self.assertEqual(done.returncode, 1)
    lines = done.stderr.rstrip("\n").splitlines()
    self.assertLen(lines, 2, done.stderr)
    self.assertEqual(
        lines[0],
        f"error: {bad}, line 2: Unable to parse value: run.batch_size = = 2",
    )
    # The caret points at the offending text, as Python's own would.
    self.assertEqual(lines[1].index("^"), lines[0].index("= 2") - 1)

  def test_checkpoint_mismatch_lists_every_parameter_without_traceback(self):
    done = self._cli(
        f"--gin_file={self.run_gin}",
        f"--gin_bindings=draft/checkpoint_path.path = '{self.tmp}/target_ckpt'",
        f"--gin_bindings={self._out('mismatch')}",
    )
    self.assertEqual(done.returncode, 1)
    lines = done.stderr.rstrip("\n").splitlines()
    self.assertRegex(
        lines[0], r"^error: draft checkpoint: Checkpoint .* does not fit"
    )
    self.assertNotIn("Traceback", done.stderr)
    unexpected = [l for l in lines if l.startswith("  unexpected: ")]
    # The target's second layer of each stack, which the draft lacks.
    target, draft = (
        traverse_util.flatten_dict(t5.param_shapes(c), sep="/")
        for c in (_TARGET, _DRAFT)
    )
    self.assertLen(unexpected, len(set(target) - set(draft)), done.stderr)
    self.assertTrue(any(l.startswith("  wrong shape: ") for l in lines))

  def test_help_exits_zero(self):
    for module in ("spec_decode.run", "spec_decode.train"):
      done = self._cli("--help", module=module)
      self.assertEqual(done.returncode, 0, done.stderr)
      self.assertIn("--gin_file", done.stdout)

  def test_a_bad_flag_is_one_line(self):
    for module, flags, error in (
        ("spec_decode.run", ["--gamma=3"], "Unknown command line flag 'gamma'"),
        (
            "spec_decode.translate",
            ["--input=x", "--temperature=-1"],
            "flag --temperature=-1.0: it must be a number >= 0",
        ),
        (
            "spec_decode.translate",
            ["--input=x", "--temperature=nan"],
            "flag --temperature=nan: it must be a number >= 0",
        ),
        (
            "spec_decode.translate",
            ["--batch_size=0"],
            "flag --batch_size=0: 0 is not a positive integer",
        ),
    ):
      with self.subTest(flags=flags):
        done = self._cli(*flags, module=module)
        self.assertEqual(done.returncode, 1)
        self.assertEqual(
            done.stderr.splitlines(),
            [f"error: {error} (--help lists the flags)"],
        )

  def test_train_with_fewer_steps_than_warmup_is_one_line(self):
    with self.assertRaisesRegex(
        ValueError,
        r"warmup_cosine.total_steps \(100, the run's number of steps\) must "
        r"exceed warmup_cosine.warmup_steps \(200\)",
    ):
      optimizers.warmup_cosine(1e-3, 200, 100)
    done = self._cli(
        "--gin_file=configs/train/multi30k_draft.gin",
        "--gin_bindings=NUM_STEPS = 100",
        f"--gin_bindings=MODEL_DIR = '{self.tmp / 'train'}'",
        module="spec_decode.train",
    )
    self.assertEqual(done.returncode, 1)
    lines = done.stderr.strip().splitlines()
    self.assertLen(lines, 1, done.stderr)
    self.assertRegex(lines[0], r"^error: warmup_cosine.total_steps \(100")


if __name__ == "__main__":
  absltest.main()
