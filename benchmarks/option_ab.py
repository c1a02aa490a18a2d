r"""A model option off and on: both decoders' loops and the calls, in turn.

Flips one boolean `T5Config` field (--option) on both models of a run config
and times, for each setting, in one process and in alternation
(`timing.interleaved_medians`, one run of each per round, the medians
counting):

- the speculative loop (greedy) over the config's first --sentences inputs,
  one sentence a batch, EOS on, as a run decodes them, without the set-up,
  and the baseline's loop (the target alone) over the same inputs: their
  ratio is the speedup of the loops alone under each setting;
- the target's 1-token and (gamma+1)-token calls and the draft's 2-token
  chunk, each in a jitted loop of --calls calls that carries the cache
  (`timing.call_loop`).

It prints each time under both settings and their ratio (on / off), the
loops' speedup under each, and whether the two settings' speculative loops
emitted the same tokens in the same target calls. A demo run's timings drift more between runs than such an option
moves them; timed in turn, both settings see the same drift.

Usage:
  python benchmarks/option_ab.py --gin_file=configs/demo.gin \
      --option=per_query_attention --sentences=100 --rounds=9 \
      --output=benchmarks/results/option_ab_per_query_demo.json
"""

import dataclasses
import json

from absl import flags
import jax
import numpy as np

from spec_decode import cli
from spec_decode import compare  # pylint: disable=unused-import (run configs)
from spec_decode import greedy_loops
from spec_decode import inputs as inputs_lib
from spec_decode import pair
from spec_decode import timing
from spec_decode.models import t5

_OPTION = flags.DEFINE_string(
    "option", None, "A True/False T5Config field, set on both models."
)
_SENTENCES = flags.DEFINE_integer("sentences", 20, "Inputs to decode.")
_GAMMA = flags.DEFINE_integer("gamma", 3, "Tokens drafted per target call.")
_MAX_DECODE_LEN = flags.DEFINE_integer("max_decode_len", 64, "Tokens per row.")
_ROUNDS = flags.DEFINE_integer("rounds", 9, "Timed rounds; the median counts.")
_CALLS = flags.DEFINE_integer("calls", 64, "Calls per timed model-call loop.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the results JSON here.")

_SETTINGS = {"off": False, "on": True}


def _with_option(loaded, value):
  """A pair.LoadedModel as `loaded`, with --option set to `value`."""
  config = dataclasses.replace(loaded.config, **{_OPTION.value: value})
  return dataclasses.replace(
      loaded, config=config, model=t5.Transformer(config)
  )


def _runs(target, draft, batches, gamma, max_decode_len, calls):
  """{name: run()} for one setting: the loop over `batches`, and the calls."""
  decoders = greedy_loops.set_up(
      target, draft, batches, gamma=gamma, max_decode_len=max_decode_len
  )
  first = decoders[0]
  position = max_decode_len // 2
  common = dict(max_decode_len=max_decode_len, eos_id=inputs_lib.EOS_ID)
  return {
      "baseline_loop": greedy_loops.baseline(decoders, **common),
      "loop": greedy_loops.speculative_loop(decoders, gamma=gamma, **common),
      "step": timing.call_loop(
          first.baseline.decode_fn, first.baseline.cache, 1, position, calls
      ),
      "verify": timing.call_loop(
          first.verifier.decode_fn,
          first.verifier.cache,
          gamma + 1,
          position,
          calls,
      ),
      "draft_chunk": timing.call_loop(
          first.proposer.decode_fn, first.proposer.cache, 2, position, calls
      ),
  }


def _check_option(config):
  """Raises ValueError unless --option names a True/False T5Config field
  that leaves the parameters as they are (both settings share them)."""
  fields = {f.name for f in dataclasses.fields(config)}
  name = _OPTION.value
  if name not in fields or not isinstance(getattr(config, name), bool):
    booleans = sorted(f for f in fields if isinstance(getattr(config, f), bool))
    raise ValueError(
        f"--option must name a True/False T5Config field, one of {booleans}; "
        f"got {name!r}"
    )
  try:
    shapes = [
        t5.param_shapes(dataclasses.replace(config, **{name: value}))
        for value in _SETTINGS.values()
    ]
  except ValueError as e:
    raise ValueError(f"--option {name}: {e}") from e
  if jax.tree.structure(shapes[0]) != jax.tree.structure(shapes[1]) or any(
      a.shape != b.shape for a, b in zip(*map(jax.tree.leaves, shapes))
  ):
    raise ValueError(
        f"--option {name} changes the model's parameters; both settings "
        "must run on the same ones"
    )


def measure(target, draft, batches):
  """Both settings' times (ms), their ratios, and whether the loops agree."""
  gamma, max_decode_len, calls = (
      _GAMMA.value,
      _MAX_DECODE_LEN.value,
      _CALLS.value,
  )
  runs, loops = {}, {}
  for setting, value in _SETTINGS.items():
    setting_runs = _runs(
        _with_option(target, value),
        _with_option(draft, value),
        batches,
        gamma,
        max_decode_len,
        calls,
    )
    loops[setting] = setting_runs["loop"]
    runs.update(
        {f"{name}_{setting}": run for name, run in setting_runs.items()}
    )
  seconds = timing.interleaved_medians(runs, _ROUNDS.value)
  ms = {}
  for name, value in seconds.items():
    ms[name] = 1e3 * value / (1 if "loop" in name else calls)
  results = {setting: jax.device_get(loop()) for setting, loop in loops.items()}
  pairs = list(zip(results["off"], results["on"]))
  return {
      "ms": ms,
      "on_over_off": {
          name: ms[f"{name}_on"] / ms[f"{name}_off"]
          for name in ("loop", "baseline_loop", "step", "verify", "draft_chunk")
      },
      "loops_speedup": {
          setting: ms[f"baseline_loop_{setting}"] / ms[f"loop_{setting}"]
          for setting in _SETTINGS
      },
      "same_tokens": all(
          np.array_equal(off.sequences, on.sequences) for off, on in pairs
      ),
      "target_calls": {
          setting: sum(int(np.max(r.target_calls)) for r in results[setting])
          for setting in _SETTINGS
      },
  }


def main(argv):
  with cli.one_line_errors():
    cli.start(argv)
    if not cli.GIN_FILES.value or _OPTION.value is None:
      raise ValueError("option_ab needs --gin_file (a run config) and --option")
    if _SENTENCES.value < 1:
      raise ValueError(f"--sentences must be >= 1, got {_SENTENCES.value}")
    target, draft = pair.load_model("target"), pair.load_model("draft")
    _check_option(target.config)
    batches = inputs_lib.run_config_batches(_SENTENCES.value, 1)
  point = measure(target, draft, batches)
  print(
      f"device: {jax.devices()[0].device_kind}, models: "
      f"{', '.join(cli.GIN_FILES.value)}, {_OPTION.value} off -> on, "
      f"{_SENTENCES.value} sentences, gamma {_GAMMA.value}"
  )
  for name, ratio in point["on_over_off"].items():
    off, on = point["ms"][f"{name}_off"], point["ms"][f"{name}_on"]
    print(f"{name:13s} {off:10.3f} ms -> {on:10.3f} ms  ({ratio:.3f})")
  speedup = point["loops_speedup"]
  print(f"loops' speedup {speedup['off']:.3f}x -> {speedup['on']:.3f}x")
  print(
      f"same tokens: {point['same_tokens']}, target calls "
      f"{point['target_calls']['off']} and {point['target_calls']['on']}"
  )
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(
          {
              "device": jax.devices()[0].device_kind,
              "models": cli.GIN_FILES.value,
              "option": _OPTION.value,
              "sentences": _SENTENCES.value,
              "gamma": _GAMMA.value,
              "max_decode_len": _MAX_DECODE_LEN.value,
              "rounds": _ROUNDS.value,
              "calls": _CALLS.value,
              **point,
          },
          f,
          indent=2,
      )


if __name__ == "__main__":
  cli.run(main)
