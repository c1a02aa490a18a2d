r"""A trained target's decode calls by kernel layout and product kernel.

  python benchmarks/kernel_layouts.py --gin_file=configs/demo.gin \
      --output=benchmarks/results/kernel_layouts_demo.json

Loads the target of a run config (as `spec_decode.run` does), then times its
1..max_tokens-token decode calls at batch 1 three times over, with the same
weights: kernels as t5x stores them ([in, out]); transposed ([out, in],
`T5Config.transposed_kernels`); and transposed, with few-row products in
spec_decode's CPU kernel (`T5Config.few_rows_kernel`). Every call runs in a
jitted loop (`timing.call_loop`), and all of them are timed in alternation,
one run of each per round (`timing.interleaved_medians`), so that every
layout meets the same machine.
"""

import dataclasses
import json

from absl import app
from absl import flags
import jax

# Registers run.*, read_inputs.* and make_mesh.*, which run configs bind.
from spec_decode import compare  # pylint: disable=unused-import
from spec_decode import cli
from spec_decode import drafts
from spec_decode import gin_config
from spec_decode import machine
from spec_decode import pair
from spec_decode import timing

# Registers seqio's vocabularies with gin, which run configs name.
from spec_decode import vocabulary  # pylint: disable=unused-import
from spec_decode.models import t5

_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 5, "Longest call (gamma+1).")
_ROUNDS = flags.DEFINE_integer("rounds", 9, "Timed rounds; medians count.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the results JSON here.")

# As benchmarks/target_dims.py: a Multi30k-length input, a call in the middle
# of a 25-token output.
INPUT_LEN = 24
POSITION = 12
CAPACITY = 64 + 9
LAYOUTS = ("t5x", "transposed", "few_rows")


def measure(config, params, max_tokens, rounds):
  """ms per call by layout and number of tokens, timed in alternation.

  Args:
    config: the target's T5Config in t5x's layout.
    params: its parameters in t5x's layout.
    max_tokens: time calls of 1..max_tokens tokens.
    rounds: timed rounds.

  Returns:
    {'ms_per_call': {layout: {tokens: ms}}, 'over_1_token': the same over
    each layout's 1-token call, 'over_t5x': {layout: {tokens: ratio}}}.
  """
  transposed = jax.jit(t5.transpose_kernels)(params)
  models = {
      "t5x": (config, params),
      "transposed": (
          dataclasses.replace(config, transposed_kernels=True),
          transposed,
      ),
      "few_rows": (
          dataclasses.replace(
              config, transposed_kernels=True, few_rows_kernel=True
          ),
          transposed,
      ),
  }
  inputs = jax.random.randint(
      jax.random.key(0), (1, INPUT_LEN), 2, config.vocab_size
  )
  runs = {}
  for layout, (layout_config, layout_params) in models.items():
    setup = drafts.t5_draft(
        t5.Transformer(layout_config), layout_params, inputs, CAPACITY
    )
    for num_tokens in range(1, max_tokens + 1):
      runs[(layout, num_tokens)] = timing.call_loop(
          setup.decode_fn, setup.cache, num_tokens, POSITION
      )
  seconds = timing.interleaved_medians(runs, rounds)
  ms = {
      layout: {
          t: 1e3 * seconds[(layout, t)] / timing.CALLS_PER_LOOP
          for t in range(1, max_tokens + 1)
      }
      for layout in LAYOUTS
  }
  return {
      "ms_per_call": ms,
      "over_1_token": {
          layout: {t: ms[layout][t] / ms[layout][1] for t in ms[layout]}
          for layout in LAYOUTS
      },
      "over_t5x": {
          layout: {t: ms[layout][t] / ms["t5x"][t] for t in ms["t5x"]}
          for layout in LAYOUTS[1:]
      },
  }


def main(argv):
  del argv
  # spec_decode.cli's --gin_file and --gin_bindings; the demo's by default.
  files = cli.GIN_FILES.value or ["demo.gin"]
  gin_config.parse(
      files,
      list(cli.GIN_BINDINGS.value)
      + [
          "target/T5Config.transposed_kernels = False",
          "target/T5Config.few_rows_kernel = False",
      ],
  )
  target = pair.load_model("target")
  results = {
      "machine": machine.describe(),
      "gin_file": files,
      "rounds": _ROUNDS.value,
      "calls_per_loop": timing.CALLS_PER_LOOP,
      **measure(target.config, target.params, _MAX_TOKENS.value, _ROUNDS.value),
  }
  print(machine.summary(results["machine"]))
  for layout in LAYOUTS:
    line = " ".join(
        f"{t}:{ms:.2f}" for t, ms in results["ms_per_call"][layout].items()
    )
    print(f"{layout:10s} ms per call by tokens {line}", flush=True)
  for layout, ratios in results["over_t5x"].items():
    line = " ".join(f"{t}:{r:.2f}" for t, r in ratios.items())
    print(f"{layout} / t5x {line}")
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      f.write(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
  app.run(main)
