"""One run: the baseline and the speculative decoder on the same inputs.

It answers a user's three questions: are the outputs unchanged (greedy rows
that differ: must be 0), how often is the draft accepted (alpha, tokens per
target call), and how much faster is it (measured speedup, next to Theorem
3.8's prediction from the measured alpha and cost ratio c).

Timing is honest: both decoders run on the same batches with the same
max_decode_len, each compiled and warmed up first; a batch's time is the median
of `timing_repeats` runs and covers encoding, cache set-up and the loop; ms per
token divides by the tokens each decoder emitted. Each batch is cut to its
longest input (rounded up to 2^k or 3 * 2^(k-1) columns, `inputs.trim`; the
caches' keys to a power of two, `drafts.keys_in_octaves`), for both decoders
alike.

Both decoders run on the mesh of `partitioning.make_mesh` (gin-configurable):
parameters are loaded sharded, rows are split over its 'data' axis, and on
several hosts each host feeds its own rows and host 0 writes the results.
"""

from typing import Any

import gin
import jax

from spec_decode import call_costs
from spec_decode import checks
from spec_decode import calibration as calibration_lib
from spec_decode import drafts
from spec_decode import engine
from spec_decode import inputs as inputs_lib
from spec_decode import lookup
from spec_decode import machine
from spec_decode import pair
from spec_decode import partitioning
from spec_decode import run_batches
from spec_decode import run_outputs
from spec_decode import run_totals
from spec_decode import sampling
from spec_decode import verify

DRAFT_KINDS = ("t5", "target", "unigram", "bigram", "lookup")


def ngram_params(kind, corpus_path, vocabulary, vocab_size):
  """The unigram or bigram NgramModel counted over `corpus_path`'s lines."""
  if corpus_path is None:
    raise ValueError(f"a {kind} draft needs run.ngram_corpus, a text file")
  lines = inputs_lib.read_text(corpus_path, "run.ngram_corpus").splitlines()
  sequences = [
      list(vocabulary.encode(line)) + [inputs_lib.EOS_ID]
      for line in lines
      if line.strip()
  ]
  count = drafts.count_unigrams if kind == "unigram" else drafts.count_bigrams
  return count(sequences, vocab_size)


def _check_args(
    gamma, draft, batch_size, max_input_len, max_decode_len, timing_repeats
):
  if gamma != "auto" and (not checks.is_int(gamma) or gamma < 1):
    raise ValueError(f"run.gamma must be an int >= 1 or 'auto', got {gamma!r}")
  if draft not in DRAFT_KINDS:
    raise ValueError(f"run.draft must be one of {DRAFT_KINDS}, got {draft!r}")
  for name, value in (
      ("batch_size", batch_size),
      ("max_input_len", max_input_len),
      ("max_decode_len", max_decode_len),
      ("timing_repeats", timing_repeats),
  ):
    checks.check_count(value, f"run.{name}")
  if gamma != "auto" and gamma > max_decode_len:
    raise ValueError(
        f"run.gamma {gamma} exceeds run.max_decode_len {max_decode_len}: "
        "drafts past the last token are wasted; lower gamma"
    )


@gin.configurable
def run(
    output_dir=gin.REQUIRED,
    vocabulary=None,
    gamma=gin.REQUIRED,
    draft="t5",
    temperature=0.0,
    top_k=0,
    top_p=1.0,
    batch_size=8,
    max_input_len=64,
    max_decode_len=64,
    truncate_inputs=False,
    seed=0,
    timing_repeats=3,
    ngram_corpus=None,
    replicate_draft=False,
    progress=True,
    verifier="block",
    draft_threshold=0.0,
    max_gamma=8,
    calibration_batches=2,
    allow_nonfinite=False,
) -> dict[str, Any]:
  """Runs both decoders on the configured inputs and reports.

  Args:
    output_dir: where outputs.jsonl, results.json and config.gin go.
    vocabulary: a seqio.Vocabulary shared by target and draft; None takes
      the target checkpoint's `spiece.model` with T5's 100 extra ids.
    gamma: tokens drafted per target call (the most, with a draft_threshold),
      or 'auto': chosen in 1..max_gamma by a calibration on the first
      `calibration_batches` batches, from the measured alpha and call costs
      (see `spec_decode.calibration`).
    draft: 't5' (the model under the draft/ scope), 'target' (the target as
      its own draft), 'unigram' or 'bigram' (counted over `ngram_corpus`),
      or 'lookup' (prompt lookup in the input and output, `lookup.py`).
    temperature: 0 is greedy.
    top_k: 0 keeps all tokens.
    top_p: 1 keeps all tokens.
    batch_size: rows per decoder call.
    max_input_len: the encoder's length; longer inputs are an error unless
      `truncate_inputs`.
    max_decode_len: most tokens emitted per row.
    truncate_inputs: cut inputs longer than max_input_len (and count them).
    seed: the sampling seed; batch i uses fold_in(seed, i) in both decoders.
    timing_repeats: timed runs per batch (after one warm-up); the median
      counts.
    ngram_corpus: a text file to count an n-gram draft over.
    replicate_draft: keep a whole copy of the draft on every device of the
      mesh's 'model' axis instead of splitting it (a small draft then needs
      no communication); the target is always split as the rules say.
    progress: show a progress bar and where the results went (on the first
      host).
    verifier: 'block' or 'token' (see `spec_decode.verify`).
    draft_threshold: in [0, 1); above 0 the draft stops early, below this
      confidence (see `speculative.speculative_decode`).
    max_gamma: the largest gamma 'auto' considers.
    calibration_batches: batches 'auto' calibrates on.
    allow_nonfinite: run on when a row's target logits are NaN or infinite
      (its output is then garbage), counting such rows; by default the run
      stops after the batch where the first one appears.

  Returns:
    The results dict, also written to output_dir/results.json.

  Raises:
    ValueError: on bad configuration or input, with a one-line message; on
      non-finite logits unless `allow_nonfinite`.
  """
  config = sampling.SamplingConfig(temperature, top_k, top_p)
  _check_args(
      gamma, draft, batch_size, max_input_len, max_decode_len, timing_repeats
  )
  _check_seed_and_switches(
      seed,
      truncate_inputs=truncate_inputs,
      replicate_draft=replicate_draft,
      progress=progress,
      allow_nonfinite=allow_nonfinite,
  )
  _check_policy(verifier, draft_threshold, max_gamma, calibration_batches)
  vocabulary = _vocabulary(vocabulary)
  writer = None
  if jax.process_index() == 0:
    writer = run_outputs.Writer(output_dir)  # Before any work: is it writable?
  texts = inputs_lib.read_inputs()
  encoded = inputs_lib.encode(texts, vocabulary, max_input_len, truncate_inputs)
  decoders = _decoders(
      draft, vocabulary, batch_size, ngram_corpus, replicate_draft
  )
  batches = list(inputs_lib.batches(encoded.tokens, batch_size))
  speculative, calibration = _speculative_settings(
      decoders,
      batches[:calibration_batches],
      seed,
      gamma,
      max_gamma,
      max_decode_len=max_decode_len,
      config=config,
      verifier=verifier,
      draft_threshold=draft_threshold,
  )
  totals, seconds = run_batches.decode(
      decoders,
      batches,
      texts,
      vocabulary,
      writer,
      batch_size=batch_size,
      seed=seed,
      timing_repeats=timing_repeats,
      progress=progress,
      allow_nonfinite=allow_nonfinite,
      output_dir=output_dir,
      **speculative,
  )
  results = _results(
      decoders,
      batches[0][0],
      totals,
      seconds=seconds,
      calibration=calibration,
      num_inputs=len(texts),
      num_truncated=encoded.num_truncated,
      **speculative,
  )
  _finish(writer, results, progress)
  return results


def _finish(writer, results, progress):
  """Writes results.json and config.gin, and says where they went (on the
  first host: elsewhere `writer` is None)."""
  if writer is None:
    return
  writer.finish(results, gin.operative_config_str())
  if progress:
    print(writer.summary())


def _decoders(draft, vocabulary, batch_size, ngram_corpus, replicate_draft):
  """The run's engine, once the vocabulary, the pair and the mesh fit.

  Raises:
    ValueError: when the vocabulary outgrows the target's, a t5 draft does
      not match the target, or batch_size does not split over the mesh.
  """
  target_config = pair.model_config("target")
  _check_vocabulary(vocabulary, target_config)
  if draft == "t5":
    pair.check_pair(target_config, pair.model_config("draft"))
  mesh = partitioning.make_mesh()
  if batch_size % mesh.shape["data"]:
    raise ValueError(
        f"run.batch_size {batch_size} does not split over the mesh's 'data' "
        f"axis of {mesh.shape['data']} devices; set make_mesh.model_parallel "
        "or make_mesh.num_devices, or the batch size"
    )
  return _engine(
      mesh, draft, target_config, vocabulary, ngram_corpus, replicate_draft
  )


def _speculative_settings(
    decoders, batches, seed, gamma, max_gamma, **settings
):
  """The speculative decoder's settings, with gamma='auto' calibrated.

  Args:
    decoders: the run's engine.Engine.
    batches: the first `calibration_batches` (tokens, real rows) pairs.
    seed: the run's sampling seed.
    gamma: run.gamma: an int, or 'auto' to choose one in 1..max_gamma by
      `calibration_lib.calibrate` on `batches`.
    max_gamma: the largest gamma 'auto' considers.
    **settings: max_decode_len, config, verifier and draft_threshold.

  Returns:
    (the settings with the gamma to decode with, the
    calibration_lib.Calibration that chose it, or None unless 'auto').
  """
  calibration = None
  if gamma == "auto":
    calibration = calibration_lib.calibrate(
        decoders,
        [decoders.place_inputs(inputs_lib.trim(batch)) for batch, _ in batches],
        max_gamma=max_gamma,
        max_decode_len=settings["max_decode_len"],
        config=settings["config"],
        verifier=settings["verifier"],
        rng=jax.random.key(seed),
    )
    gamma = calibration.gamma
  return dict(gamma=gamma, **settings), calibration


def _results(
    decoders,
    first_batch,
    totals,
    *,
    seconds,
    calibration,
    num_inputs,
    num_truncated,
    **speculative,
):
  """The run's results: its totals, its call costs and its gamma policy.

  Args:
    decoders: the run's engine.Engine.
    first_batch: the first batch's tokens; the call costs are measured on it.
    totals: the run's run_totals.RunTotals.
    seconds: the run's run_totals.Seconds.
    calibration: gamma='auto''s calibration_lib.Calibration, or None.
    num_inputs: the inputs decoded.
    num_truncated: those of them cut to max_input_len.
    **speculative: the speculative decoder's settings (gamma,
      max_decode_len, config, verifier, draft_threshold).

  Returns:
    The results dict of `run`.
  """
  gamma = speculative["gamma"]
  costs = call_costs.measure(
      decoders,
      decoders.place_inputs(inputs_lib.trim(first_batch)),
      gamma,
      speculative["max_decode_len"],
  )
  results = run_totals.results(
      totals,
      seconds,
      costs,
      gamma,
      speculative["config"],
      num_inputs,
      num_truncated,
  )
  results.update(
      verifier=speculative["verifier"],
      draft_threshold=speculative["draft_threshold"],
      gamma_policy="fixed" if calibration is None else "auto",
      calibration=None if calibration is None else calibration.to_json(),
      draft_calls_per_target_call=totals.draft_calls / totals.target_calls,
      machine=machine.describe(),
  )
  return results


def _engine(
    mesh, draft, target_config, vocabulary, ngram_corpus, replicate_draft
):
  """The run's target and draft, loaded onto `mesh`, as an engine.Engine."""
  draft_rules = partitioning.rules(replicate_model=replicate_draft)
  target = pair.load_model("target", mesh)
  draft_model = draft_params = None
  if draft == "t5":
    loaded = pair.load_model("draft", mesh, draft_rules)
    draft_model, draft_params = loaded.model, loaded.params
  elif draft == "lookup":
    draft_params = lookup.PromptLookup(target_config.vocab_size)
  elif draft in ("unigram", "bigram"):
    draft_params = engine.place_ngram(
        ngram_params(draft, ngram_corpus, vocabulary, target_config.vocab_size),
        mesh,
    )
  return engine.Engine(
      mesh,
      target.model,
      target.params,
      draft_model,
      draft_params,
      draft_rules=draft_rules,
  )


def _vocabulary(vocabulary):
  """run.vocabulary, loaded; unset, the target checkpoint's spiece.model."""
  # Imported here: it imports seqio, and with it TensorFlow.
  # pylint: disable-next=g-import-not-at-top
  from spec_decode import vocabulary as vocabulary_lib

  return vocabulary_lib.for_run(
      vocabulary, pair.bound_checkpoint_path("target")
  )


def _check_seed_and_switches(seed, **switches):
  if not checks.is_int(seed):
    raise ValueError(f"run.seed must be an int, got {seed!r}")
  for name, value in switches.items():
    # A string such as 'False' would be true.
    if not isinstance(value, bool):
      raise ValueError(f"run.{name} must be True or False, got {value!r}")


def _check_policy(verifier, draft_threshold, max_gamma, calibration_batches):
  if verifier not in verify.VERIFIERS:
    raise ValueError(
        f"run.verifier must be one of {verify.VERIFIERS}, got {verifier!r}"
    )
  if not checks.is_number(draft_threshold) or not (0 <= draft_threshold < 1):
    raise ValueError(
        f"run.draft_threshold must be in [0, 1), got {draft_threshold!r}"
    )
  for name, value in (
      ("max_gamma", max_gamma),
      ("calibration_batches", calibration_batches),
  ):
    checks.check_count(value, f"run.{name}")


def _check_vocabulary(vocabulary, target_config):
  if vocabulary.vocab_size > target_config.vocab_size:
    raise ValueError(
        f"the vocabulary has {vocabulary.vocab_size} ids, more than the "
        f"target's vocab_size {target_config.vocab_size}"
    )
