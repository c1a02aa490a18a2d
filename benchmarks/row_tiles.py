r"""Products of 17-64 rows: the few-rows kernel's tiles against XLA's dot.

  python benchmarks/row_tiles.py --gin_file=configs/demo.gin \
      --output=benchmarks/results/row_tiles_demo.json

Loads a run config's target and draft (as `spec_decode.run` does; the target
must have `T5Config.few_rows_kernel`) and times, in alternation
(`timing.interleaved_medians`), the same programs traced twice: with the
products of 17 to `few_rows.MAX_ROWS` rows in the kernel's register tiles,
and in XLA's dot (`few_rows.MAX_ROWS` set to 16 while that variant is
traced):

- the set-up both decoders make before their loops (`drafts.t5_pair`): the
  target's encoding and both models' caches, over the run config's first
  --sentences inputs, one sentence a batch, as a run decodes them, the caches
  as long as its run.max_decode_len and run.gamma make them;
- each of --rows rows times each shape of the target's weight matrices
  (attention [H*D, E] and [E, H*D], MLP [F, E] and [E, F]), over enough
  copies of the matrix to fill --megabytes, so that the weights stream from
  DRAM as in a run.

Prints each time in both variants and tiles / XLA, and writes them as JSON.
"""

import json

from absl import app
from absl import flags
import gin
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import checks
from spec_decode import cli
from spec_decode import compare  # pylint: disable=unused-import (run configs)
from spec_decode import drafts
from spec_decode import inputs as inputs_lib
from spec_decode import machine
from spec_decode import pair
from spec_decode import timing
from spec_decode.kernels import few_rows

_SENTENCES = flags.DEFINE_integer("sentences", 100, "Inputs set up.")
_ROWS = flags.DEFINE_list("rows", ["17", "24", "32", "48", "64"], "Rows.")
_MEGABYTES = flags.DEFINE_integer("megabytes", 96, "Weights per product run.")
_ROUNDS = flags.DEFINE_integer("rounds", 9, "Timed rounds; medians count.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the results JSON here.")

# The most rows the kernel took before it computed in tiles.
_FEW_ROWS = few_rows.TILE_MIN_ROWS - 1
_VARIANTS = ("tiles", "xla")


def _traced_in(variant, fn, *args_list):
  """`fn` jitted and traced on each args in `args_list` for `variant`."""
  # A new function each time: jit would reuse a trace of `fn` itself.
  jitted = jax.jit(lambda *args: fn(*args))
  saved = few_rows.MAX_ROWS
  few_rows.MAX_ROWS = saved if variant == "tiles" else _FEW_ROWS
  try:
    for args in args_list:
      jax.block_until_ready(jitted(*args))
  finally:
    few_rows.MAX_ROWS = saved
  return jitted


def _setup_runs(target, draft, batches, capacity):
  """{variant: run()}: both decoders' set-up over `batches`, their caches
  holding `capacity` positions."""

  def setup(target_params, draft_params, inputs):
    verifier, proposer = drafts.t5_pair(
        target.model, target_params, draft.model, draft_params, inputs, capacity
    )
    return verifier.cache, proposer.cache

  args = [(target.params, draft.params, inputs) for inputs in batches]
  runs = {}
  for variant in _VARIANTS:
    jitted = _traced_in(variant, setup, *args)
    runs[variant] = lambda jitted=jitted: [jitted(*a) for a in args]
  return runs


def _run_capacity():
  """The caches' positions in the run config's speculative decoder."""
  gamma = gin.query_parameter("run.gamma")
  if not checks.is_int(gamma) or gamma < 1:
    raise ValueError(
        f"the run config's run.gamma must be an int >= 1, got {gamma!r}: the "
        "set-up's caches hold max_decode_len + gamma + 1 positions"
    )
  return drafts.speculative_capacity(
      gin.query_parameter("run.max_decode_len"), gamma
  )


def _weight_shapes(config):
  """The target's distinct [N, K] weight shapes."""
  heads = config.num_heads * config.head_dim
  shapes = [
      (heads, config.emb_dim),
      (config.emb_dim, heads),
      (config.mlp_dim, config.emb_dim),
      (config.emb_dim, config.mlp_dim),
  ]
  return list(dict.fromkeys(shapes))


def _product_runs(shape, rows, megabytes):
  """{variant: run()}: `rows` rows times copies of an [N, K] matrix."""
  n, k = shape
  rng = np.random.default_rng(0)
  copies = max(2, megabytes * 2**20 // (4 * n * k))
  weights = [
      jnp.asarray(rng.standard_normal((n, k), np.float32))
      for _ in range(copies)
  ]
  x = jnp.asarray(rng.standard_normal((rows, k), np.float32))

  def chain(x, weights):
    return [few_rows.product(x, w) for w in weights]

  return {
      variant: (
          lambda jitted=_traced_in(variant, chain, (x, weights)): jitted(
              x, weights
          )
      )
      for variant in _VARIANTS
  }, copies


def _max_difference(runs):
  tiles, xla = (jax.tree.leaves(runs[v]()) for v in _VARIANTS)
  return max(
      float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b))))
      for a, b in zip(tiles, xla)
  )


def measure(target, draft, batches, capacity, rows, megabytes, rounds):
  """Set-up and product times (ms) in both variants, and tiles / XLA."""
  runs = _setup_runs(target, draft, batches, capacity)
  seconds = timing.interleaved_medians(runs, rounds)
  setup = {
      f"{v}_ms_per_sentence": seconds[v] / len(batches) * 1e3 for v in runs
  }
  setup["tiles_over_xla"] = seconds["tiles"] / seconds["xla"]
  setup["max_cache_difference"] = _max_difference(runs)
  products = []
  for shape in _weight_shapes(target.config):
    for m in rows:
      runs, copies = _product_runs(shape, m, megabytes)
      seconds = timing.interleaved_medians(runs, rounds)
      products.append(
          {
              "rows": m,
              "n_k": list(shape),
              **{f"{v}_ms": seconds[v] / copies * 1e3 for v in runs},
              "tiles_over_xla": seconds["tiles"] / seconds["xla"],
              "max_difference": _max_difference(runs),
          }
      )
  return {"setup": setup, "products": products}


def main(argv):
  with cli.one_line_errors():
    cli.start(argv)
    rows = [int(m) for m in _ROWS.value]
    if any(not few_rows.TILE_MIN_ROWS <= m <= few_rows.MAX_ROWS for m in rows):
      raise ValueError(
          f"--rows must be within {few_rows.TILE_MIN_ROWS}-"
          f"{few_rows.MAX_ROWS} (the kernel's tiles), got {_ROWS.value}"
      )
    if _SENTENCES.value < 1 or _ROUNDS.value < 1:
      raise ValueError("--sentences and --rounds must be >= 1")
    capacity = _run_capacity()
    target, draft = pair.load_model("target"), pair.load_model("draft")
    if not target.config.few_rows_kernel:
      raise ValueError(
          "the run config's target has T5Config.few_rows_kernel = False: "
          "nothing to compare"
      )
    batches = inputs_lib.run_config_batches(_SENTENCES.value, 1)
  point = measure(
      target, draft, batches, capacity, rows, _MEGABYTES.value, _ROUNDS.value
  )
  setup = point["setup"]
  print(machine.summary(machine.describe()))
  print(
      f"set-up, {len(batches)} sentences: tiles "
      f"{setup['tiles_ms_per_sentence']:.2f} ms a sentence, XLA "
      f"{setup['xla_ms_per_sentence']:.2f} ({setup['tiles_over_xla']:.3f}); "
      f"caches differ by at most {setup['max_cache_difference']:.1e}"
  )
  for p in point["products"]:
    n, k = p["n_k"]
    print(
        f"{p['rows']:3d} rows x [{n}, {k}]: tiles {p['tiles_ms']:.3f} ms, "
        f"XLA {p['xla_ms']:.3f} ms ({p['tiles_over_xla']:.3f})"
    )
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(
          {
              "machine": machine.describe(),
              "models": cli.GIN_FILES.value,
              "sentences": len(batches),
              "cache_capacity": capacity,
              "megabytes": _MEGABYTES.value,
              "rounds": _ROUNDS.value,
              **point,
          },
          f,
          indent=2,
      )


if __name__ == "__main__":
  app.run(main)
