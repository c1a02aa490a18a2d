"""No silent garbage, no lost work: non-finite logits, corrupt checkpoints,
one-line errors, and what a run writes (issue 14)."""

import dataclasses
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
import seqio

import fake_models
import run_test
from spec_decode import checkpoints
from spec_decode import cli
from spec_decode import compare
from spec_decode import data
from spec_decode import decoding
from spec_decode import gin_config
from spec_decode import inputs as inputs_lib
from spec_decode import optimizers
from spec_decode import partitioning
from spec_decode import run_outputs
from spec_decode import sampling
from spec_decode import speculative
from spec_decode import train_checkpoints
from spec_decode import vocabulary  # pylint: disable=unused-import  (gin)
from spec_decode.models import t5

_VOCAB = 128
_GAMMA = 3
# The tiny pair of run_test's gin files.
_save_t5x = run_test._save_t5x_checkpoint  # pylint: disable=protected-access
_TARGET = t5.T5Config(
    vocab_size=_VOCAB,
    emb_dim=32,
    num_heads=2,
    head_dim=8,
    mlp_dim=64,
    num_encoder_layers=2,
    num_decoder_layers=2,
)
_DRAFT = fake_models.tiny_t5(_VOCAB)


class _Poisoned:
  """A fake model whose logits are NaN (or +inf) on the rows marked."""

  def __init__(self, model, rows, value):
    self.model, self.rows, self.value = model, rows, value

  def __call__(self, tokens, cache):
    logits, cache = self.model(tokens, cache)
    return jnp.where(self.rows[:, None, None], self.value, logits), cache


jax.tree_util.register_pytree_node(
    _Poisoned,
    lambda p: ((p.model, p.rows, p.value), None),
    lambda _, children: _Poisoned(*children),
)


class NonfiniteLogitsTest(parameterized.TestCase):
  """Rows whose target logits go NaN or inf are flagged; ids stay in range."""

  @parameterized.product(
      temperature=(0.0, 1.0), value=(float("nan"), float("inf"))
  )
  def test_loops_flag_the_rows_and_stay_in_the_vocabulary(
      self, temperature, value
  ):
    vocab_size, batch_size = 11, 4
    model = fake_models.random_model(0, vocab_size)
    rows = jnp.array([False, True, False, True])
    target = _Poisoned(model, rows, jnp.float32(value))
    draft = fake_models.perturbed(model, 1, 0.5)
    contexts = fake_models.context_ids(batch_size)
    config = sampling.SamplingConfig(temperature)
    base = decoding.autoregressive_decode(
        target,
        model.init_cache(contexts, 20),
        jax.random.key(0),
        max_decode_len=12,
        config=config,
    )
    spec = speculative.speculative_decode(
        target,
        draft,
        model.init_cache(contexts, 20),
        model.init_cache(contexts, 20),
        jax.random.key(0),
        gamma=3,
        max_decode_len=12,
        config=config,
    )
    for result in (base, spec):
      np.testing.assert_array_equal(result.nonfinite, rows)
      self.assertTrue(np.all(np.asarray(result.sequences) < vocab_size))
      self.assertTrue(np.all(np.asarray(result.sequences) >= 0))

  def test_a_nan_draft_is_not_counted_and_changes_nothing(self):
    model = fake_models.random_model(0, 11)
    contexts = fake_models.context_ids(3)
    draft = _Poisoned(model, jnp.ones((3,), bool), jnp.float32(jnp.nan))
    args = dict(max_decode_len=12, config=sampling.SamplingConfig(0.0))
    base = decoding.autoregressive_decode(
        model, model.init_cache(contexts, 20), jax.random.key(0), **args
    )
    spec = speculative.speculative_decode(
        model,
        draft,
        model.init_cache(contexts, 20),
        model.init_cache(contexts, 20),
        jax.random.key(0),
        gamma=2,
        **args,
    )
    np.testing.assert_array_equal(spec.sequences, base.sequences)
    self.assertFalse(np.any(spec.nonfinite))


class LogitsDtypeTest(absltest.TestCase):
  """T5Config.logits_dtype, the knob of the README's bfloat16 measurement."""

  def test_float32_logits_by_default_bfloat16_on_request(self):
    params = t5.init_params(_DRAFT, jax.random.key(0))
    tokens = jnp.array([[3, 4, 1]])
    for dtype in ("float32", "bfloat16"):
      config = dataclasses.replace(_DRAFT, dtype="bfloat16", logits_dtype=dtype)
      logits = t5.Transformer(config).apply({"params": params}, tokens, tokens)
      self.assertEqual(logits.dtype, jnp.dtype(dtype))
    with self.assertRaisesRegex(ValueError, "T5Config.logits_dtype must be"):
      dataclasses.replace(_DRAFT, logits_dtype="float16")


class CheckpointIntegrityTest(absltest.TestCase):
  """Checksums of exports, and NaN / inf in any format, refuse to load."""

  def setUp(self):
    super().setUp()
    self.tmp = pathlib.Path(tempfile.mkdtemp())
    self.params = t5.init_params(_DRAFT, jax.random.key(0))
    self.shapes = t5.param_shapes(_DRAFT)

  def _export(self, params=None):
    directory = self.tmp / "export"
    train_checkpoints.export_params(
        self.params if params is None else params, directory, jnp.bfloat16
    )
    return directory

  def test_export_records_checksums_and_loads(self):
    directory = self._export()
    sums = json.loads((directory / "checksums.json").read_text())
    flat = traverse_util.flatten_dict(self.params, sep="/")
    self.assertEqual(set(sums), set(flat))
    loaded = checkpoints.load_params(str(directory), self.shapes, jnp.float32)
    name = "decoder/logits_dense/kernel"
    np.testing.assert_array_equal(
        traverse_util.flatten_dict(loaded, sep="/")[name],
        np.asarray(flat[name].astype(jnp.bfloat16), np.float32),
    )

  def test_changed_array_fails_its_checksum(self):
    directory = self._export()
    sums_file = directory / "checksums.json"
    sums = json.loads(sums_file.read_text())
    # As if the stored bytes had changed: the record no longer matches them.
    sums["encoder/layers_0/mlp/wo/kernel"]["sha256"] = "0" * 64
    sums_file.write_text(json.dumps(sums))
    mesh = partitioning.make_mesh(num_devices=2)
    for shardings in (
        None,  # Read whole.
        partitioning.shardings(
            self.shapes, t5.param_logical_axes(_DRAFT), mesh
        ),  # Read shard by shard, as runs do.
    ):
      with self.assertRaisesRegex(
          checkpoints.CheckpointError,
          r"^.*/export: parameter encoder/layers_0/mlp/wo/kernel does not "
          r"match its checksum in checksums.json",
      ):
        checkpoints.load_params(
            str(directory), self.shapes, jnp.float32, shardings
        )

  def test_random_bytes_over_a_data_file_fail(self):
    directory = self._export()
    # Random bytes over the middle half of every data file (the process's
    # and the merged manifest's, which may hold small values inline):
    # whatever tensorstore then decodes, or fails to, must not load.
    rng = np.random.default_rng(0)
    for data in sorted(p for p in directory.rglob("d/*") if p.is_file()):
      size = data.stat().st_size
      with open(data, "r+b") as f:
        f.seek(size // 4)
        f.write(rng.bytes(size // 2))
    with self.assertRaises(checkpoints.CheckpointError) as raised:
      checkpoints.load_params(str(directory), self.shapes, jnp.float32)
    self.assertNotIn("\n", str(raised.exception))
    self.assertIn(str(directory), str(raised.exception))

  def test_nan_parameter_is_named_in_every_format(self):
    flat = traverse_util.flatten_dict(self.params, sep="/")
    name = "encoder/layers_0/attention/query/kernel"
    flat[name] = flat[name].at[0, 1].set(jnp.nan).at[1, 2].set(jnp.inf)
    broken = traverse_util.unflatten_dict(flat, sep="/")
    _save_t5x(jax.device_get(broken), self.tmp / "t5x")
    # An export records the NaN in its checksum; the value check refuses it.
    for directory in (self.tmp / "t5x", self._export(broken)):
      with self.assertRaisesRegex(
          checkpoints.CheckpointError,
          f"parameter {name} holds 2 NaN or infinite values of "
          f"{flat[name].size}",
      ):
        checkpoints.load_params(str(directory), self.shapes, jnp.float32)

  def test_shipped_demo_models_have_checksums(self):
    demo = pathlib.Path(__file__).resolve().parent.parent / "spec_decode/demo"
    for name in ("target", "draft", "draft_distilled"):
      self.assertTrue((demo / name / "checksums.json").is_file(), name)


class OfflineTest(absltest.TestCase):
  """The paper's configs and the README's commands without the network."""

  def test_unprepared_tfds_dataset_is_one_line(self):
    # In a process of its own: a TFDS builder may start TensorFlow's GCS
    # file system (threads that outlive the test) looking for its files.
    script = """
from unittest import mock
import seqio
from spec_decode import data, inputs
builder = seqio.get_mixture_or_task("wmt_t2t_en_de").source.tfds_dataset
with mock.patch.object(type(builder.builder), "is_prepared", return_value=False):
  try:
    inputs.read_inputs(task="wmt_t2t_en_de")
  except ValueError as e:
    print(e)
"""
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=pathlib.Path(__file__).resolve().parent.parent,
    )
    # `data` registered the task, importing tensorflow_datasets, which needs
    # importlib_resources.
    self.assertRegex(
        result.stdout.splitlines()[0],
        r"^seqio task wmt_t2t_en_de reads the TFDS dataset "
        r"wmt_t2t_translate/de-en:1.0.0, which is not prepared in .*: "
        r"prepare it with `tfds build wmt_t2t_translate/de-en`",
    )

  def test_unreachable_gcs_fails_at_once(self):
    with mock.patch.object(
        checkpoints.socket, "getaddrinfo", side_effect=OSError(-2, "no DNS")
    ):
      with self.assertRaisesRegex(
          checkpoints.CheckpointError,
          r"^cannot read gs://b/ckpt: storage.googleapis.com does not "
          r"resolve \(no DNS\)",
      ):
        checkpoints.load_params("gs://b/ckpt", t5.param_shapes(_DRAFT))

  def test_tensorflow_file_errors_are_one_line(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    stderr = io.StringIO()
    with mock.patch.object(sys, "stderr", stderr):
      with self.assertRaises(SystemExit) as exited:
        with cli.one_line_errors():
          raise tf.errors.FailedPreconditionError(
              None, None, "Could not resolve host\n when reading gs://x/y"
          )
    self.assertEqual(exited.exception.code, 1)
    self.assertEqual(
        stderr.getvalue(),
        "error: Could not resolve host when reading gs://x/y\n",
    )

  def test_multi30k_training_text_ships_in_the_package(self):
    package = pathlib.Path(data.__file__).resolve().parent
    self.assertEqual(data.multi30k_dir(), package / "demo" / "multi30k")
    for split, size in (("train", 29_000), ("validation", 1_014)):
      sources, references = data.parallel_text(data.MULTI30K, split)
      self.assertLen(sources, size)
      self.assertLen(references, size)


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
      with self.assertRaises(KeyboardInterrupt):
        self._run(f"run.output_dir = '{out}'")
    rows = [json.loads(r) for r in (out / "outputs.jsonl").open()]
    self.assertLen(rows, 4)
    self.assertTrue(all(row["identical"] for row in rows))
    # No stale report beside the new outputs.
    self.assertFalse((out / "results.json").exists())

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
