r"""The decoding loops' own cost: an iteration against the calls it makes.

A speculative iteration makes gamma + 1 model calls: the draft on a 2-token
chunk, then gamma - 1 single-token draft steps, then the target on gamma + 1
tokens. A baseline iteration makes one single-token target call. Everything
else an iteration runs (sampling, the verifier, the bookkeeping of lengths and
histories, the while loop itself) is the loop's own cost. This prints, per
batch size and gamma:

- the baseline's and the speculative decoder's ms per emitted token, their
  speedup, and tokens per target call;
- each call's time, timed alone in a jitted loop of 64 such calls that
  carries the cache as the decoders do (so in-graph, as in the loops);
- iteration / calls: the speculative iteration's time over the sum of its
  calls' times, and the baseline's iteration over its step. 1 means the
  loop costs nothing of its own;
- the same calls made in sequence, as an iteration makes them (draft chunk,
  draft steps, verify) in a jitted loop with nothing else, and the
  iteration's time over theirs: the loop's own work alone. Where two models
  alternate, the sequence can cost more than the sum of the calls timed
  alone (README, "Loop overhead").

Both decoders run greedily on the same inputs. By default the inputs are
random and EOS is disabled, so every row emits max_decode_len tokens. With
--sentences=N (and --gin_file), they are the run config's first N inputs
(its `read_inputs` and vocabulary) in batches of each batch size, with EOS
on, as a run decodes them: each row stops at its EOS, an iteration is one
of a batch's (its rows decode together until the last one stops), and "ms
per token" is per such step of a batch. "same tokens" is the fraction of
tokens on which the decoders agree (below 1 only where a (gamma + 1)-token
pass and a one-token pass round a near-tie differently, e.g. under TF32 or
bfloat16 matmuls). The decoders and the call loops are timed in
alternation, one run of each per round (`timing.interleaved_medians`), and
the medians count, so that a shared machine's drift reaches every ratio
alike.

Models: with --gin_file, the target and T5 draft of a run config (their
checkpoints; the draft may be a shared-encoder one); without, the tiny T5
with random weights as its own draft (alpha = 1, every drafted token
accepted).

Usage:
  python benchmarks/loop_overhead.py --gin_file=configs/demo.gin \
      --batch_sizes=1,8 --gammas=4 --max_decode_len=128 \
      --output=benchmarks/results/loop_overhead_demo.json
  python benchmarks/loop_overhead.py --gin_file=configs/demo.gin \
      --batch_sizes=1 --gammas=3 --max_decode_len=64 --sentences=20
  python benchmarks/loop_overhead.py --batch_sizes=1,8 --max_decode_len=64
"""

import functools
import json

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import cli
from spec_decode import compare  # pylint: disable=unused-import (run configs)
from spec_decode import gin_config
from spec_decode import greedy_loops
from spec_decode import inputs as inputs_lib
from spec_decode import pair
from spec_decode import timing
from spec_decode.models import t5

_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "8"], "Batch sizes.")
_GAMMAS = flags.DEFINE_list("gammas", ["4"], "Draft lengths.")
_MAX_DECODE_LEN = flags.DEFINE_integer("max_decode_len", 128, "Tokens per row.")
_INPUT_LEN = flags.DEFINE_integer(
    "input_len", 16, "Encoder input length of the random inputs."
)
_SENTENCES = flags.DEFINE_integer(
    "sentences",
    0,
    "With --gin_file: decode the run config's first N inputs, EOS on, "
    "instead of random inputs.",
)
_ROUNDS = flags.DEFINE_integer("rounds", 7, "Timed rounds; the median counts.")
_CALLS = flags.DEFINE_integer("calls", 64, "Calls per timed model-call loop.")
_MODEL_GIN = flags.DEFINE_string(
    "model_gin",
    "models/t5_1_1_tiny.gin",
    "Without --gin_file: the model config, under configs/.",
)
_OUTPUT = flags.DEFINE_string("output", None, "Write the results JSON here.")

# No token id is negative: the rows never stop early, so both decoders emit
# max_decode_len tokens per row.
_NO_EOS = -1
# The longest input --sentences encodes; each batch is trimmed to its own.
_MAX_SENTENCE_LEN = 512


def _models():
  """(description, target, draft): pair.LoadedModels, draft None for itself."""
  if cli.GIN_FILES.value:
    target, draft = pair.load_model("target"), pair.load_model("draft")
    return ", ".join(cli.GIN_FILES.value), target, draft
  gin_config.parse([_MODEL_GIN.value])
  config = t5.T5Config()
  target = pair.LoadedModel(
      "target",
      config,
      t5.Transformer(config),
      t5.init_params(config, jax.random.key(0)),
  )
  return f"{_MODEL_GIN.value} (its own draft)", target, None


@functools.partial(jax.jit, static_argnames=("gamma", "iterations"))
def _call_sequence(
    target_fn, draft_fn, target_cache, draft_cache, position, gamma, iterations
):
  """`iterations` times an iteration's calls, alone; the sum of their logits.

  As in `timing.call_loop`, every call starts from `position` and the caches
  are carried, so that no call is loop invariant or dead.
  """
  batch_size = target_cache.lengths.shape[0]
  tokens = lambda n: jnp.full((batch_size, n), 2, jnp.int32)  # [B, n]
  lengths = jnp.full((batch_size,), position, jnp.int32)

  def body(_, carry):
    target_cache, draft_cache, total = carry
    logits, draft_cache = draft_fn(
        tokens(2), draft_cache.replace(lengths=lengths)
    )
    total += jnp.sum(logits, axis=(1, 2))
    for _ in range(gamma - 1):
      logits, draft_cache = draft_fn(tokens(1), draft_cache)
      total += jnp.sum(logits, axis=(1, 2))
    logits, target_cache = target_fn(
        tokens(gamma + 1), target_cache.replace(lengths=lengths)
    )
    return target_cache, draft_cache, total + jnp.sum(logits, axis=(1, 2))

  carry = (target_cache, draft_cache, jnp.zeros((batch_size,)))
  return jax.lax.fori_loop(0, iterations, body, carry)[2]


def _random_batch(vocab_size, batch_size):
  """int32 [B, --input_len] random token ids."""
  return np.random.default_rng(0).integers(
      2, vocab_size, (batch_size, _INPUT_LEN.value)
  )


def _runs(target, draft, batches, gamma, max_decode_len, calls, eos_id):
  """{name: run()}: both decoders over `batches`, each call loop (on the
  first batch's caches), and the call sequence."""
  decoders = greedy_loops.set_up(
      target, draft, batches, gamma=gamma, max_decode_len=max_decode_len
  )
  first = decoders[0]
  baseline, verifier, proposer = first.baseline, first.verifier, first.proposer
  position = max_decode_len // 2
  run_baseline = greedy_loops.baseline(
      decoders, max_decode_len=max_decode_len, eos_id=eos_id
  )
  run_speculative = greedy_loops.speculative_loop(
      decoders, gamma=gamma, max_decode_len=max_decode_len, eos_id=eos_id
  )
  return {
      "baseline": run_baseline,
      "speculative": run_speculative,
      "step": timing.call_loop(
          baseline.decode_fn, baseline.cache, 1, position, calls
      ),
      "verify": timing.call_loop(
          verifier.decode_fn, verifier.cache, gamma + 1, position, calls
      ),
      "draft_chunk": timing.call_loop(
          proposer.decode_fn, proposer.cache, 2, position, calls
      ),
      "draft_step": timing.call_loop(
          proposer.decode_fn, proposer.cache, 1, position, calls
      ),
      "sequence": lambda: _call_sequence(
          verifier.decode_fn,
          proposer.decode_fn,
          verifier.cache,
          proposer.cache,
          position,
          gamma,
          calls,
      ),
  }


def measure(target, draft, batches, gamma, max_decode_len, rounds, calls):
  """One point: the decoders' and their calls' times, and their ratios.

  Args:
    target: a pair.LoadedModel.
    draft: a pair.LoadedModel, or None for the target as its own draft.
    batches: int32 [B, S] input batches; one random batch (EOS off), or the
      run config's sentences (EOS on).
    gamma, max_decode_len: the decoding setting.
    rounds: timed rounds (`timing.interleaved_medians`).
    calls: calls per timed call loop.

  Returns:
    A dict of the point's numbers (times in ms).
  """
  eos_id = inputs_lib.EOS_ID if _SENTENCES.value else _NO_EOS
  runs = _runs(target, draft, batches, gamma, max_decode_len, calls, eos_id)
  seconds = timing.interleaved_medians(runs, rounds)
  ms = {name: 1e3 * value for name, value in seconds.items()}
  for name in ("step", "verify", "draft_chunk", "draft_step", "sequence"):
    ms[name] /= calls
  results = jax.device_get(runs["speculative"]())
  expected = jax.device_get(runs["baseline"]())
  # A batch decodes until its last row stops: its longest row's count.
  iterations = sum(int(np.max(result.target_calls)) for result in results)
  steps = sum(int(np.max(result.lengths)) for result in expected)
  same = np.concatenate(
      [
          (result.sequences == base.sequences).ravel()
          for result, base in zip(results, expected)
      ]
  )
  iteration_calls = ms["verify"] + ms["draft_chunk"]
  iteration_calls += (gamma - 1) * ms["draft_step"]
  speculative_iteration = ms["speculative"] / iterations
  return {
      "batch_size": batches[0].shape[0],
      "gamma": gamma,
      "sentences": _SENTENCES.value,
      "baseline_ms_per_token": ms["baseline"] / steps,
      "speculative_ms_per_token": ms["speculative"] / steps,
      "speedup": ms["baseline"] / ms["speculative"],
      "tokens_per_target_call": float(
          sum(np.sum(result.lengths) for result in results)
          / sum(np.sum(result.target_calls) for result in results)
      ),
      "iterations": iterations,
      "steps": steps,
      "step_ms": ms["step"],
      "verify_ms": ms["verify"],
      "draft_chunk_ms": ms["draft_chunk"],
      "draft_step_ms": ms["draft_step"],
      "c": ms["draft_step"] / ms["step"],
      "verify_over_step": ms["verify"] / ms["step"],
      "speculative_iteration_ms": speculative_iteration,
      "speculative_calls_ms": iteration_calls,
      "speculative_iteration_over_calls": speculative_iteration
      / iteration_calls,
      "call_sequence_ms": ms["sequence"],
      "speculative_iteration_over_sequence": speculative_iteration
      / ms["sequence"],
      "baseline_iteration_over_step": ms["baseline"] / steps / ms["step"],
      "same_tokens": float(np.mean(same)),
  }


def _batches(target, batch_size):
  """The point's input batches: the run's sentences, or one random batch."""
  if _SENTENCES.value:
    return inputs_lib.run_config_batches(
        _SENTENCES.value, batch_size, _MAX_SENTENCE_LEN
    )
  return [_random_batch(target.config.vocab_size, batch_size)]


def main(argv):
  with cli.one_line_errors():
    cli.start(argv)
    if _SENTENCES.value < 0 or (_SENTENCES.value and not cli.GIN_FILES.value):
      raise ValueError(
          "--sentences takes a count >= 0, and a run config (--gin_file) "
          f"whose inputs to decode; got --sentences={_SENTENCES.value}"
      )
    description, target, draft = _models()
  max_decode_len, rounds = _MAX_DECODE_LEN.value, _ROUNDS.value
  print(f"device: {jax.devices()[0].device_kind}, models: {description}")
  print(
      "batch gamma | base ms/tok  spec ms/tok  speedup tok/call |"
      " step ms verify ms draft ms | iteration/calls: spec  base |"
      " sequence ms  iteration/sequence | same"
  )
  points = []
  for batch_size in [int(size) for size in _BATCH_SIZES.value]:
    for gamma in [int(gamma) for gamma in _GAMMAS.value]:
      point = measure(
          target,
          draft,
          _batches(target, batch_size),
          gamma,
          max_decode_len,
          rounds,
          _CALLS.value,
      )
      points.append(point)
      print(
          f"{batch_size:5d} {gamma:5d} |"
          f" {point['baseline_ms_per_token']:11.3f}"
          f"  {point['speculative_ms_per_token']:11.3f}"
          f"  {point['speedup']:7.2f} {point['tokens_per_target_call']:8.2f} |"
          f" {point['step_ms']:7.3f} {point['verify_ms']:9.3f}"
          f" {point['draft_step_ms']:8.3f} |"
          f" {point['speculative_iteration_over_calls']:20.3f}"
          f" {point['baseline_iteration_over_step']:5.3f} |"
          f" {point['call_sequence_ms']:11.3f}"
          f" {point['speculative_iteration_over_sequence']:19.3f} |"
          f" {point['same_tokens']:.4f}",
          flush=True,
      )
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(
          {
              "device": jax.devices()[0].device_kind,
              "models": description,
              "max_decode_len": max_decode_len,
              "sentences": _SENTENCES.value,
              "rounds": rounds,
              "points": points,
          },
          f,
          indent=2,
      )


if __name__ == "__main__":
  cli.run(main)
