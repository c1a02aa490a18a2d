r"""Chooses a demo target's dimensions by the cost of its decode calls.

  python benchmarks/target_dims.py --output=benchmarks/results/target_dims.json

Theorem 3.8 assumes that scoring gamma + 1 tokens in one target call costs
one step, which holds when the weights stream from memory at every call and
not when the call is compute-bound (a small model whose weights sit in the
CPU's cache). For each candidate T5 (random float32 weights, batch 1, the
demo's 4,096 vocabulary) this times decode calls of 1..9 tokens in-graph with
`timing.seconds_per_call`, and prints each call's cost over a 1-token call,
next to the bytes of the decoder path (decoder layers and logits layer) that
every call reads.
"""

import dataclasses
import json

from absl import app
from absl import flags
import jax

from spec_decode import drafts
from spec_decode import gin_config
from spec_decode import machine
from spec_decode import timing
from spec_decode.models import t5
from spec_decode.models.config import T5Config

_OUTPUT = flags.DEFINE_string("output", None, "Write the results JSON here.")
_REPEATS = flags.DEFINE_integer("repeats", 9, "Timed loops; medians count.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 9, "Longest call (gamma+1).")
_ONLY = flags.DEFINE_list("only", None, "Candidate names to measure.")
_TRANSPOSED = flags.DEFINE_bool(
    "transposed_kernels", False, "T5Config.transposed_kernels of each."
)

# Multi30k inputs are about 20 tokens with the task prefix; a call in the
# middle of a 25-token output.
INPUT_LEN = 24
POSITION = 12
CAPACITY = 64 + 9

# Each candidate: a size file under configs/models/ and the fields that
# differ from it. The demo pair as shipped, then candidate targets whose
# decoder path does not fit a 32 MiB L3 in float32.
CANDIDATES = {
    "demo_draft": ("demo_draft", {}),
    "demo_target_9m": ("demo_target", {}),
    "e512_d6_m2048": (
        "demo_target",
        dict(emb_dim=512, num_heads=8, mlp_dim=2048, num_decoder_layers=6),
    ),
    "e512_d8_m2048": (
        "demo_target",
        dict(emb_dim=512, num_heads=8, mlp_dim=2048, num_decoder_layers=8),
    ),
    "e768_d4_m2048": (
        "demo_target",
        dict(emb_dim=768, num_heads=12, mlp_dim=2048, num_decoder_layers=4),
    ),
    "e768_d6_m3072": (
        "demo_target",
        dict(emb_dim=768, num_heads=12, mlp_dim=3072, num_decoder_layers=6),
    ),
}


def candidate_config(name):
  """The T5Config of a candidate (see CANDIDATES)."""
  stem, fields = CANDIDATES[name]
  gin_config.parse([f"models/{stem}.gin"])
  return dataclasses.replace(
      T5Config(), transposed_kernels=_TRANSPOSED.value, **fields
  )


def decoder_path_bytes(params):
  """Bytes of the decoder stack's parameters, logits layer included."""
  return sum(x.nbytes for x in jax.tree.leaves(params["decoder"]))


def measure(name, rng):
  """One candidate's call costs: ms per call for 1..max_tokens tokens."""
  config = candidate_config(name)
  model = t5.Transformer(config)
  shapes = t5.param_shapes(config)
  leaves, tree = jax.tree.flatten(shapes)
  keys = jax.random.split(rng, len(leaves))
  params = jax.tree.unflatten(
      tree,
      [0.05 * jax.random.normal(k, s.shape) for k, s in zip(keys, leaves)],
  )
  inputs = jax.random.randint(rng, (1, INPUT_LEN), 2, config.vocab_size)
  setup = drafts.t5_draft(model, params, inputs, CAPACITY)
  ms = {}
  for num_tokens in range(1, _MAX_TOKENS.value + 1):
    ms[num_tokens] = 1e3 * timing.seconds_per_call(
        setup.decode_fn,
        setup.cache,
        num_tokens,
        POSITION,
        repeats=_REPEATS.value,
    )
  result = {
      "config": dataclasses.asdict(config),
      "parameters": t5.num_params(config),
      "decoder_path_mb_float32": decoder_path_bytes(params) / 1e6,
      "ms_per_call": ms,
      "over_1_token": {t: ms[t] / ms[1] for t in ms},
  }
  ratios = " ".join(f"{t}:{r:.2f}" for t, r in result["over_1_token"].items())
  print(
      f"{name:16s} {result['parameters']:>11,} params, decoder path "
      f"{result['decoder_path_mb_float32']:6.1f} MB, 1-token "
      f"{ms[1]:.3f} ms; T-token / 1-token {ratios}",
      flush=True,
  )
  return result


def main(argv):
  del argv
  rng = jax.random.key(0)
  names = _ONLY.value or list(CANDIDATES)
  results = {
      "device": str(jax.devices()[0].device_kind),
      "machine": machine.describe(),
      "jax": jax.__version__,
      "batch": 1,
      "transposed_kernels": _TRANSPOSED.value,
      "input_len": INPUT_LEN,
      "position": POSITION,
      "repeats": _REPEATS.value,
      "candidates": {name: measure(name, rng) for name in names},
  }
  draft = results["candidates"].get("demo_draft")
  if draft:
    for result in results["candidates"].values():
      result["c_with_demo_draft"] = (
          draft["ms_per_call"][1] / result["ms_per_call"][1]
      )
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      f.write(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
  app.run(main)
