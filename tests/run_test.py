"""spec_decode.run end to end on a tiny pair, and its one-line errors."""

import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
from flax import serialization
import gin
import jax
import sentencepiece as spm

from spec_decode import compare
from spec_decode import gin_config
from spec_decode import vocabulary  # pylint: disable=unused-import  (gin)
from spec_decode.models import t5

_WORDS = (
    "a dog runs in the park . two men play football on green grass . "
    "ein hund läuft im park . zwei männer spielen fußball auf grünem "
    "gras . the woman reads a book near the water ."
).split()
_GAMMA = 3
# Exact outputs of the greedy run for its fixed inputs, written once with
# SPEC_DECODE_WRITE_GOLDEN=1 and reviewed by hand.
_GOLDEN = pathlib.Path(__file__).parent / "testdata" / "golden_run_greedy.json"
_GOLDEN_COUNTS = (
    "alpha",
    "alpha_estimate",
    "baseline_tokens",
    "speculative_tokens",
    "target_calls",
)


def alpha_interval(judged, failure_probability=1e-6):
  """How far the measured alpha may be from its estimate E[beta].

  Each judged draft is accepted with probability beta given the past, so
  (accepted - sum beta) is a martingale with increments of range 1, and by
  the Azuma-Hoeffding inequality |alpha - alpha_estimate| exceeds
  sqrt(log(2 / delta) / (2 n)) with probability at most delta, for n judged
  drafts. A union over the n <= judged possible counts gives delta =
  failure_probability / judged.

  Args:
    judged: drafted tokens the target judged.
    failure_probability: the chance, for a correct sampler, of exceeding it.

  Returns:
    The half-width of the interval.
  """
  delta = failure_probability / judged
  return math.sqrt(math.log(2 / delta) / (2 * judged))


def _tiny_model_gin(vocab_size, emb_dim, layers):
  return (
      f"T5Config.vocab_size = {vocab_size}\nT5Config.emb_dim = {emb_dim}\n"
      "T5Config.num_heads = 2\nT5Config.head_dim = 8\n"
      f"T5Config.mlp_dim = {2 * emb_dim}\n"
      f"T5Config.num_encoder_layers = {layers}\n"
      f"T5Config.num_decoder_layers = {layers}\n"
  )


def _save_t5x_checkpoint(params, directory):
  os.makedirs(directory)
  with open(os.path.join(directory, "checkpoint"), "wb") as f:
    f.write(serialization.msgpack_serialize({"target": params, "state": {}}))


def run_gin_text(tmp, num_devices):
  """A run file for the tiny pair, vocabulary and inputs written in `tmp`."""
  return f"""
include 'target:{tmp}/target.gin'
include 'draft:{tmp}/draft.gin'
target/checkpoint_path.path = '{tmp}/target_ckpt'
draft/checkpoint_path.path = '{tmp}/draft_ckpt'
run.vocabulary = @seqio.SentencePieceVocabulary()
seqio.SentencePieceVocabulary.sentencepiece_model_file = '{tmp}/spm.model'
seqio.SentencePieceVocabulary.extra_ids = 10
run.gamma = {_GAMMA}
run.batch_size = 2
run.max_input_len = 32
run.max_decode_len = 12
run.timing_repeats = 1
run.progress = False
read_inputs.path = '{tmp}/inputs.txt'
make_mesh.num_devices = {num_devices}
"""


class RunTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = pathlib.Path(tempfile.mkdtemp())
    # For runs that fail before they write.
    cls.unused_output = f"run.output_dir = '{cls.tmp / 'unused'}'"
    rng = jax.random.key(0)
    sentences = [
        " ".join(_WORDS[(7 * i) % 30 : (7 * i) % 30 + 6]) for i in range(200)
    ]
    (cls.tmp / "corpus.txt").write_text("\n".join(sentences))
    spm.SentencePieceTrainer.train(
        input=str(cls.tmp / "corpus.txt"),
        model_prefix=str(cls.tmp / "spm"),
        vocab_size=50,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        minloglevel=2,
    )
    vocab_size = 128  # 50 pieces and 10 extra ids, padded.
    for name, emb_dim, layers, seed in (
        ("target", 32, 2, 0),
        ("draft", 16, 1, 1),
    ):
      (cls.tmp / f"{name}.gin").write_text(
          _tiny_model_gin(vocab_size, emb_dim, layers)
      )
      config = t5.T5Config(
          vocab_size=vocab_size,
          emb_dim=emb_dim,
          num_heads=2,
          head_dim=8,
          mlp_dim=2 * emb_dim,
          num_encoder_layers=layers,
          num_decoder_layers=layers,
      )
      params = t5.init_params(config, jax.random.fold_in(rng, seed))
      _save_t5x_checkpoint(params, cls.tmp / f"{name}_ckpt")
    (cls.tmp / "inputs.txt").write_text("\n".join(sentences[:5]))
    cls.run_gin = cls.tmp / "run.gin"
    # Rows split over 2 of the 8 simulated devices (tests/conftest.py).
    cls.run_gin.write_text(run_gin_text(cls.tmp, num_devices=2))

  def tearDown(self):
    gin.clear_config()
    super().tearDown()

  def _cli(self, *bindings, gin_file=None):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "spec_decode.run",
            f"--gin_file={gin_file or self.run_gin}",
        ]
        + [f"--gin_bindings={b}" for b in bindings],
        capture_output=True,
        text=True,
        check=False,
    )

  def _run(self, *bindings):
    gin_config.parse([self.run_gin], bindings)
    return compare.run()

  def _check_setup_times(self, results, batches):
    """Each decoder's set-up (encoder and caches) was timed alone.

    It is a part of what the decoder took per batch, and the speedup less
    the set-ups is the ratio of what remains.

    Args:
      results: a run's results.json.
      batches: how many batches the run decoded.
    """
    after_setup = []
    for name in ("baseline", "speculative"):
      tokens = results[f"{name}_tokens"]
      batch_ms = results[f"{name}_ms_per_token"] * tokens / batches
      setup_ms = results[f"{name}_setup_ms"]
      self.assertGreater(setup_ms, 0.0)
      self.assertLess(setup_ms, batch_ms)
      after_setup.append((batch_ms - setup_ms) / tokens)
    self.assertAlmostEqual(
        results["speedup_after_setup"], after_setup[0] / after_setup[1]
    )

  def test_cli_greedy_report(self):
    out = self.tmp / "greedy"
    done = self._cli(f"run.output_dir = '{out}'")
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn("speedup (Theorem 3.8)", done.stdout)
    results = json.loads((out / "results.json").read_text())
    self.assertEqual(results["mismatches"], 0)
    self.assertEqual(results["num_examples"], 5)
    self.assertBetween(results["alpha"], 0.0, 1.0)
    self.assertBetween(results["tokens_per_target_call"], 1.0, _GAMMA + 1)
    self.assertEqual(results["baseline_tokens"], results["speculative_tokens"])
    self.assertGreater(results["c"], 0.0)
    # Theorem 3.8 with the (gamma+1)-token call measured, not one step.
    self.assertAlmostEqual(
        results["call_cost_speedup"],
        results["tokens_per_target_call"]
        * results["target_step_ms"]
        / (
            results["gamma"] * results["draft_step_ms"]
            + results["target_verify_ms"]
        ),
        places=9,
    )
    self.assertIn("  with the measured call costs", done.stdout)
    # 5 examples in batches of 2.
    self._check_setup_times(results, batches=3)
    self.assertIn("speedup after set-up", done.stdout)
    # Where it ran, in the results and on the report's first line.
    self.assertEqual(results["machine"]["platform"], "cpu")
    self.assertEqual(results["machine"]["num_devices"], 8)
    self.assertTrue(done.stdout.startswith("machine "), done.stdout)
    for key in (
        "alpha",
        "tokens_per_target_call",
        "speedup",
        "predicted_speedup",
        "c",
        "gamma",
        "optimal_gamma",
        "temperature",
        "num_examples",
        "mismatches",
    ):
      self.assertIn(key, results)
    rows = [
        json.loads(line)
        for line in (out / "outputs.jsonl").read_text().splitlines()
    ]
    self.assertLen(rows, 5)
    self.assertTrue(all(row["identical"] for row in rows))
    self.assertIn(
        "target/T5Config.emb_dim = 32", (out / "config.gin").read_text()
    )

  def test_target_as_draft_accepts_everything(self):
    results = self._run(
        f"run.output_dir = '{self.tmp / 'self'}'", "run.draft = 'target'"
    )
    self.assertEqual(results["alpha"], 1.0)
    self.assertEqual(results["mismatches"], 0)

  def test_sampling_run(self):
    results = self._run(
        f"run.output_dir = '{self.tmp / 'sampled'}'",
        "run.temperature = 1.0",
        "run.draft = 'bigram'",
        f"run.ngram_corpus = '{self.tmp / 'corpus.txt'}'",
    )
    self.assertIsNone(results["mismatches"])
    self.assertBetween(results["alpha"], 0.0, 1.0)
    self.assertBetween(results["tokens_per_target_call"], 1.0, _GAMMA + 1)

  def test_greedy_outputs_equal_the_golden_file(self):
    out = self.tmp / "golden"
    results = self._run(f"run.output_dir = '{out}'")
    rows = [
        json.loads(line)
        for line in (out / "outputs.jsonl").read_text().splitlines()
    ]
    got = dict(
        outputs=[[row["input"], row["speculative"]] for row in rows],
        **{key: results[key] for key in _GOLDEN_COUNTS},
    )
    if os.environ.get("SPEC_DECODE_WRITE_GOLDEN"):
      _GOLDEN.write_text(json.dumps(got, indent=2, ensure_ascii=False) + "\n")
    self.assertEqual(got, json.loads(_GOLDEN.read_text()))

  def test_sampled_alpha_is_within_its_interval_of_the_estimate(self):
    results = self._run(
        f"run.output_dir = '{self.tmp / 'sampled_alpha'}'",
        "run.temperature = 1.0",
        "run.gamma = 1",
        "run.max_decode_len = 48",
    )
    # At gamma 1 every target call judges exactly one draft.
    drafted = results["target_calls"]
    self.assertGreater(drafted, 0)
    self.assertLess(
        abs(results["alpha"] - results["alpha_estimate"]),
        alpha_interval(drafted),
    )

  def test_unknown_binding_is_one_line(self):
    done = self._cli(self.unused_output, "run.gama = 3")
    self.assertEqual(done.returncode, 1)
    self.assertEqual(done.stdout, "")
    lines = done.stderr.strip().splitlines()
    self.assertLen(lines, 1, done.stderr)
    self.assertIn("gama", lines[0])

  def test_missing_checkpoint_is_one_line(self):
    done = self._cli(
        self.unused_output,
        "target/checkpoint_path.path = '/nonexistent/ckpt'",
    )
    self.assertEqual(done.returncode, 1)
    lines = done.stderr.strip().splitlines()
    self.assertLen(lines, 1, done.stderr)
    self.assertRegex(lines[0], r"^error: target checkpoint: .*/nonexistent")

  @parameterized.named_parameters(
      ("gamma", "run.gamma = 0", "gamma must be an int >= 1"),
      ("gamma_name", "run.gamma = 'best'", "gamma must be .* or 'auto'"),
      ("verifier", "run.verifier = 'tree'", "run.verifier must be one of"),
      (
          "draft_threshold",
          "run.draft_threshold = 1.0",
          r"run.draft_threshold must be in \[0, 1\)",
      ),
      ("max_gamma", "run.max_gamma = 0", "run.max_gamma must be an int >= 1"),
      # A bool is an int to Python; these were gamma 1 and batch 1.
      ("gamma_bool", "run.gamma = True", "gamma must be an int >= 1"),
      (
          "batch_size_bool",
          "run.batch_size = True",
          "run.batch_size must be an int >= 1, got True",
      ),
      (
          "draft_threshold_bool",
          "run.draft_threshold = False",
          r"run.draft_threshold must be in \[0, 1\), got False",
      ),
      ("temperature", "run.temperature = -0.5", "temperature must be >= 0"),
      (
          "temperature_name",
          "run.temperature = 'hot'",
          "temperature must be >= 0, got 'hot'",
      ),
      ("seed", "run.seed = 'x'", "run.seed must be an int, got 'x'"),
      (
          "switch",
          "run.allow_nonfinite = 'False'",
          "run.allow_nonfinite must be True or False, got 'False'",
      ),
      (
          "num_examples",
          "read_inputs.num_examples = -1",
          "read_inputs.num_examples must be an int >= 1, or None for all "
          "inputs, got -1",
      ),
      (
          "prefix",
          "read_inputs.prefix = 3",
          "read_inputs.prefix must be a string",
      ),
      ("top_p_zero", "run.top_p = 0.0", r"top_p must be in \(0, 1\]"),
      ("top_p_big", "run.top_p = 1.5", r"top_p must be in \(0, 1\]"),
      (
          "vocab",
          "draft/T5Config.vocab_size = 256",
          r"draft's vocab_size \(256\) differs from the target's \(128\)",
      ),
      (
          "too_long",
          "run.max_input_len = 4",
          "input 1 has .* tokens .* more than max_input_len=4",
      ),
      (
          "batch_over_mesh",
          "make_mesh.num_devices = 4",
          "run.batch_size 2 does not split over the mesh's 'data' axis of 4",
      ),
      (
          "heads_over_model",
          "make_mesh.num_devices = 8\nmake_mesh.model_parallel = 8",
          "target parameter decoder/relpos_bias/rel_embedding: an axis of "
          "size 2 cannot be split 8 ways over mesh axis 'model'",
      ),
  )
  def test_bad_input(self, binding, message):
    with self.assertRaisesRegex(ValueError, message):
      self._run(self.unused_output, binding)

  def test_empty_input_file(self):
    empty = self.tmp / "empty.txt"
    empty.write_text("\n\n")
    with self.assertRaisesRegex(ValueError, "no inputs: input file .* empty"):
      self._run(self.unused_output, f"read_inputs.path = '{empty}'")

  def test_truncation_is_counted(self):
    results = self._run(
        f"run.output_dir = '{self.tmp / 'cut'}'",
        "run.max_input_len = 4",
        "run.truncate_inputs = True",
    )
    self.assertEqual(results["num_truncated"], 5)


if __name__ == "__main__":
  absltest.main()
