r"""Decode-call costs of a target and a draft at real T5 sizes, and hence c.

  python benchmarks/step_costs.py --target=t5_1_1_xxl --draft=t5_1_1_small
  python benchmarks/step_costs.py --abstract \
      --output=benchmarks/results/step_costs_abstract.json
  python benchmarks/step_costs.py --abstract --tpu_topology=v5p:2x2x1 \
      --output=benchmarks/results/step_costs_abstract_tpu.json
  python benchmarks/step_costs.py --abstract --tpu_topology=v5p:2x2x1 \
      --attention_buckets=4 \
      --output=benchmarks/results/step_costs_abstract_tpu_buckets4.json

With --abstract it needs no accelerator and no weights: it compiles the
target's 1- and (gamma+1)-token calls and the draft's 1-token call for this
host from abstract shapes, at batch 1 and 32, and reports XLA's flops and
bytes accessed against the bytes each call must read (`compiled_costs`).
With --tpu_topology it compiles them for a TPU chip instead, which needs
libtpu (`pip install "libtpu==0.0.42.*"`) but no TPU. With
--attention_buckets=n each call reads the cache up to its bound
(`T5Config.attention_buckets`), as the decode loop's body at these lengths.

Random weights in bfloat16, batch 1 by default (the paper's setting). It times
the target's 1-token and (gamma+1)-token decode calls and the draft's 1-token
call at a mid-sequence cache length, then predicts the walltime improvement
at the paper's alphas two ways: Theorem 3.8 with c = draft step / target step
(the paper assumes a (gamma+1)-token call costs one step), and the same with
the measured (gamma+1)-token call in place of one step. It also runs the whole
baseline and speculative loops with the target as its own draft (alpha = 1),
which shows the loop's overhead at this size.
"""

import dataclasses
import functools
import json
import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from spec_decode import analysis
from spec_decode import compiled_costs
from spec_decode import decoding
from spec_decode import drafts
from spec_decode import gin_config
from spec_decode import machine
from spec_decode import speculative
from spec_decode import timing
from spec_decode.models import t5

_TARGET = flags.DEFINE_string("target", "t5_1_1_xxl", "configs/models/ stem.")
_DRAFT = flags.DEFINE_string("draft", "t5_1_1_small", "configs/models/ stem.")
_GAMMA = flags.DEFINE_integer("gamma", 7, "Tokens drafted per target call.")
_BATCH = flags.DEFINE_integer("batch", 1, "Rows per call.")
_INPUT_LEN = flags.DEFINE_integer("input_len", 64, "Encoder tokens per row.")
_MAX_DECODE_LEN = flags.DEFINE_integer("max_decode_len", 64, "Decode length.")
_REPEATS = flags.DEFINE_integer("repeats", 30, "Timed calls; medians count.")
_LOOP = flags.DEFINE_bool("loop", True, "Also time the full loops.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the results JSON here.")
_TPU_TOPOLOGY = flags.DEFINE_string(
    "tpu_topology",
    None,
    "With --abstract: compile for the first chip of this TPU topology (e.g. "
    "'v5p:2x2x1') instead of this host, with no TPU (needs libtpu), in "
    "bfloat16 only.",
)
_ATTENTION_BUCKETS = flags.DEFINE_integer(
    "attention_buckets",
    1,
    "With --abstract: T5Config.attention_buckets of both models.",
)
_ABSTRACT = flags.DEFINE_bool(
    "abstract",
    False,
    "Compile the calls for this host from abstract shapes (no weights) and "
    "report XLA's flops and bytes against the bytes a call must read.",
)

# The paper's alphas for T5 1.1 XXL with a T5-small draft on WMT En-De
# (Leviathan et al., 2023, Table 2), and its measured speedups on TPU-v4.
PAPER = {"temperature 0": (0.75, 3.4), "temperature 1": (0.62, 2.6)}


def _config(stem, dtype="bfloat16"):
  gin_config.parse([f"models/{stem}.gin"], [f"T5Config.dtype = '{dtype}'"])
  return t5.T5Config()


@functools.partial(jax.jit, static_argnums=0)
def _random_params(config, rng):
  """Random bfloat16 parameters, made on the device (no host copy)."""
  shapes = t5.param_shapes(config)
  leaves, tree = jax.tree.flatten(shapes)
  keys = jax.random.split(rng, len(leaves))
  return jax.tree.unflatten(
      tree,
      [
          (0.05 * jax.random.normal(k, s.shape, jnp.float32)).astype(
              jnp.bfloat16
          )
          for k, s in zip(keys, leaves)
      ],
  )


# Encoding and cache set-up, compiled: op-by-op dispatch of an XXL encoder is
# slow.
_setup = jax.jit(drafts.t5_draft, static_argnums=(0, 3))


# The abstract report: 256-token inputs, a cache of 264 positions filled to
# 128, batch 1 (the paper's) and 32 (a serving batch), gamma 7. bfloat16 is
# what runs; float32 is a control, because XLA:CPU widens bfloat16 dots and
# scatters to float32 (converting each weight and cache layer and back), which
# an accelerator's compile does not.
ABSTRACT_DTYPES = ("bfloat16", "float32")
ABSTRACT_BATCHES = (1, 32)
ABSTRACT_INPUT_LEN = 256
ABSTRACT_CAPACITY = 264
ABSTRACT_FILLED = 128


def abstract_report(gamma, tpu_topology=None, attention_buckets=1):
  """Each call's compiled costs, keyed '{model}_{tokens}tok_b{batch}'.

  The float32 control's keys end in '_float32'. With a TPU topology, the
  calls compile for its first chip, in bfloat16 only (the control is for
  XLA:CPU's widening).
  """
  device = tpu_topology and compiled_costs.tpu_device(tpu_topology)
  report = {
      "jax": jax.__version__,
      "backend": (
          f"tpu {tpu_topology} ({device.device_kind}), compiled with no TPU"
          if device
          else jax.default_backend()
      ),
      "input_len": ABSTRACT_INPUT_LEN,
      "capacity": ABSTRACT_CAPACITY,
      "filled": ABSTRACT_FILLED,
      "attention_buckets": attention_buckets,
      "calls": {},
  }
  for dtype in ABSTRACT_DTYPES[:1] if device else ABSTRACT_DTYPES:
    suffix = "" if dtype == "bfloat16" else f"_{dtype}"
    for name, stem, num_tokens in (
        ("target", _TARGET.value, 1),
        ("target", _TARGET.value, gamma + 1),
        ("draft", _DRAFT.value, 1),
    ):
      config = dataclasses.replace(
          _config(stem, dtype), attention_buckets=attention_buckets
      )
      for batch in ABSTRACT_BATCHES:
        costs = compiled_costs.call_costs(
            config,
            batch,
            num_tokens,
            ABSTRACT_INPUT_LEN,
            ABSTRACT_CAPACITY,
            ABSTRACT_FILLED,
            device=device or None,
        )
        entry = dataclasses.asdict(costs)
        entry["bytes_over_needed"] = costs.bytes_over_needed
        entry["offchip_over_needed"] = costs.offchip_over_needed
        report["calls"][f"{name}_{num_tokens}tok_b{batch}{suffix}"] = entry
        print(
            f"{dtype:8s} {name:6s} {stem:14s} tokens {num_tokens} batch "
            f"{batch:2d}: {costs.flops / 1e9:9.2f} GFLOP, "
            f"{costs.bytes_accessed / 1e9:7.2f} GB accessed, params "
            f"{costs.param_bytes / 1e9:6.2f} GB, cache "
            f"{costs.cache_bytes / 1e9:6.3f} GB, ratio "
            f"{costs.bytes_over_needed:5.2f}, off-chip "
            f"{costs.offchip_bytes / 1e9:7.2f} GB, ratio "
            f"{costs.offchip_over_needed:5.2f}, keys read {costs.key_limit}, "
            f"{costs.hlo_ops} HLO ops, "
            f"{len(costs.cache_moves)} cache-sized copies/transposes",
            flush=True,
        )
  return report


def timed_call_costs(setups, gamma, repeats):
  """The timed calls, c and the paper's predictions from them.

  Args:
    setups: {'target': ..., 'draft': ...} `drafts.t5_draft` set-ups.
    gamma: tokens drafted per target call.
    repeats: timed loops per call; the median counts.

  Returns:
    The results dict: the calls' ms, c, the (gamma+1)-token call over a
    step, and per paper setting Theorem 3.8 with and without that call.
  """
  position = _MAX_DECODE_LEN.value // 2
  target_step, target_verify, draft_step = (
      timing.seconds_per_call(
          setups[name].decode_fn,
          setups[name].cache,
          num_tokens,
          position,
          repeats=repeats,
      )
      for name, num_tokens in (
          ("target", 1),
          ("target", gamma + 1),
          ("draft", 1),
      )
  )
  c = draft_step / target_step
  results = {
      "device": str(jax.devices()[0].device_kind),
      "machine": machine.describe(),
      "jax": jax.__version__,
      "batch": setups["target"].cache.lengths.shape[0],
      "gamma": gamma,
      "target_step_ms": 1e3 * target_step,
      "target_verify_ms": 1e3 * target_verify,
      "draft_step_ms": 1e3 * draft_step,
      "c": c,
      "verify_over_step": target_verify / target_step,
      "predictions": {},
  }
  for label, (alpha, paper_speedup) in PAPER.items():
    tokens = analysis.expected_tokens_per_call(alpha, gamma)
    results["predictions"][label] = {
        "alpha": alpha,
        "paper_speedup_tpu_v4": paper_speedup,
        "theorem_3_8": analysis.walltime_improvement(alpha, gamma, c),
        "with_measured_verify": analysis.call_cost_speedup(
            tokens, gamma, target_step, target_verify, draft_step
        ),
        "optimal_gamma": analysis.optimal_gamma(alpha, c),
    }
  return results


def self_draft_loop(target, inputs, rng, gamma, results):
  """Both whole loops with the target as its own draft (alpha = 1).

  Args:
    target: the target's `drafts.t5_draft` set-up.
    inputs: int32 [B, S] the encoder's inputs.
    rng: the sampling key.
    gamma: tokens drafted per target call.
    results: `timed_call_costs`'s results, for the ideal speedup.

  Returns:
    ms per token of each loop, their ratio, and the ratio the timed calls
    allow a loop with no cost of its own.
  """
  max_decode_len = _MAX_DECODE_LEN.value
  baseline_cache = _setup(
      target.decode_fn.model, target.decode_fn.params, inputs, max_decode_len
  ).cache
  # No EOS (-1): both loops emit exactly max_decode_len tokens per row.
  baseline = timing.median_seconds(
      lambda: decoding.autoregressive_decode(
          target.decode_fn,
          baseline_cache,
          rng,
          max_decode_len=max_decode_len,
          eos_id=-1,
      ).sequences,
      3,
  )
  spec = timing.median_seconds(
      lambda: speculative.speculative_decode(
          target.decode_fn,
          target.decode_fn,
          target.cache,
          target.cache,
          rng,
          gamma=gamma,
          max_decode_len=max_decode_len,
          eos_id=-1,
      ).sequences,
      3,
  )
  step, verify = results["target_step_ms"], results["target_verify_ms"]
  return {
      "baseline_ms_per_token": 1e3 * baseline / max_decode_len,
      "speculative_ms_per_token": 1e3 * spec / max_decode_len,
      "speedup": baseline / spec,
      "ideal": analysis.call_cost_speedup(gamma + 1, gamma, step, verify, step),
  }


def _write(results):
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      f.write(json.dumps(results, indent=2) + "\n")


def main(argv):
  del argv
  if _TPU_TOPOLOGY.value and not _ABSTRACT.value:
    sys.exit("step_costs.py: --tpu_topology needs --abstract")
  if _ABSTRACT.value:
    try:
      _write(
          abstract_report(
              _GAMMA.value, _TPU_TOPOLOGY.value, _ATTENTION_BUCKETS.value
          )
      )
    except ValueError as e:
      sys.exit(f"step_costs.py: {e}")
    return
  gamma = _GAMMA.value
  rng = jax.random.key(0)
  inputs = jax.random.randint(rng, (_BATCH.value, _INPUT_LEN.value), 2, 32000)
  setups = {}
  for name, stem in (("target", _TARGET.value), ("draft", _DRAFT.value)):
    config = _config(stem)
    params = _random_params(config, jax.random.fold_in(rng, len(setups)))
    setups[name] = _setup(
        t5.Transformer(config),
        params,
        inputs,
        _MAX_DECODE_LEN.value + gamma + 1,
    )
    print(f"{name}: {stem}, {t5.num_params(config):,} parameters", flush=True)
  results = timed_call_costs(setups, gamma, _REPEATS.value)
  print(json.dumps(results, indent=2), flush=True)
  if _LOOP.value:
    results["self_draft_loop"] = self_draft_loop(
        setups["target"], inputs, rng, gamma, results
    )
    print(json.dumps(results["self_draft_loop"], indent=2))
  _write(results)


if __name__ == "__main__":
  app.run(main)
