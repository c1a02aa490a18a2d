r"""Token vs block verification, and fixed gamma vs early stop vs 'auto'.

On the pair of the gin files (configs/demo.gin: the demo pair on Multi30k
test), for each temperature and batch size, every batch is decoded by the
baseline and by each variant in turn, with the same key, so all see the same
inputs:

- token-wise and block verification at fixed gammas (--token_gammas,
  --block_gammas);
- block verification with early stop at each --thresholds, drafting up to
  --gamma_max tokens;
- block verification at gamma = 'auto' (`spec_decode.calibration`, on the
  first --calibration_batches batches, up to --gamma_max).

It prints a Markdown table per setting: tokens per target call (which timing
noise does not touch), draft calls per target call, ms per token and the
measured speedup (baseline / variant, medians of --repeats timed runs a
batch after a compiling warm-up), and greedy rows that differ from the
baseline (must be 0); and writes every number to --output (JSON).

  python benchmarks/verifiers.py --gin_file=configs/demo.gin \
      --gin_bindings="read_inputs.num_examples = 200" --output=verifiers.json
"""

import json

from absl import app
from absl import flags
import gin
import jax
import numpy as np

from spec_decode import calibration
from spec_decode import cli
from spec_decode import compare  # pylint: disable=unused-import (run.*)
from spec_decode import engine
from spec_decode import inputs as inputs_lib
from spec_decode import pair
from spec_decode import partitioning
from spec_decode import sampling
from spec_decode import timing

_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "Temperatures.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "8"], "Batch sizes.")
_TOKEN_GAMMAS = flags.DEFINE_list("token_gammas", ["3", "6"], "Token gammas.")
_BLOCK_GAMMAS = flags.DEFINE_list(
    "block_gammas", ["2", "3", "4", "5", "6"], "Block verification gammas."
)
_THRESHOLDS = flags.DEFINE_list(
    "thresholds", ["0.4", "0.7"], "Early-stop draft thresholds."
)
_GAMMA_MAX = flags.DEFINE_integer("gamma_max", 8, "Early stop's and auto's.")
_CALIBRATION_BATCHES = flags.DEFINE_integer(
    "calibration_batches", 2, "Batches 'auto' calibrates on."
)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs a batch.")
_MAX_DECODE_LEN = flags.DEFINE_integer("max_decode_len", 64, "Tokens per row.")
_SEED = flags.DEFINE_integer("seed", 0, "Batch i uses fold_in(seed, i).")
_OUTPUT = flags.DEFINE_string("output", "verifiers.json", "The JSON written.")


def _variants(auto_gamma):
  """(name, gamma, verifier, draft_threshold) of each variant."""
  variants = [
      (f"token g{gamma}", int(gamma), "token", 0.0)
      for gamma in _TOKEN_GAMMAS.value
  ]
  variants += [
      (f"block g{gamma}", int(gamma), "block", 0.0)
      for gamma in _BLOCK_GAMMAS.value
  ]
  variants += [
      (f"block early stop {t} (g<={_GAMMA_MAX.value})", _GAMMA_MAX.value)
      + ("block", float(t))
      for t in _THRESHOLDS.value
  ]
  variants.append((f"block auto (g{auto_gamma})", auto_gamma, "block", 0.0))
  return variants


def _placed_batches(decoders, tokens, batch_size):
  """[(placed int32 [batch_size, S] inputs, real rows)] of `tokens`' batches."""
  return [
      (decoders.place_inputs(inputs_lib.trim(batch)), num_real)
      for batch, num_real in inputs_lib.batches(tokens, batch_size)
  ]


def _calibrate(decoders, batches, config):
  """'auto's `calibration.Calibration` on the first batches, up to gamma_max."""
  return calibration.calibrate(
      decoders,
      [placed for placed, _ in batches[: _CALIBRATION_BATCHES.value]],
      max_gamma=_GAMMA_MAX.value,
      max_decode_len=_MAX_DECODE_LEN.value,
      config=config,
      verifier="block",
      rng=jax.random.key(_SEED.value),
  )


def _add_batch(totals, decoders, batch, index, config, variants, warm_up):
  """Times the baseline then each variant on a batch, adding to `totals`.

  Args:
    totals: {name: sums of tokens, calls, seconds and differing rows} of the
      baseline ("baseline") and every variant, added to in place.
    decoders: the `engine.Engine`.
    batch: (placed int32 [batch_size, S] inputs, real rows).
    index: the batch's index: its key is fold_in(seed, index).
    config: the `sampling.SamplingConfig`.
    variants: `_variants`.
    warm_up: whether to compile (a first run, untimed) before the timed runs.
  """
  placed, num_real = batch
  rng = jax.random.fold_in(jax.random.key(_SEED.value), index)
  max_decode_len = _MAX_DECODE_LEN.value
  base, seconds = timing.timed(
      lambda: decoders.baseline(
          placed, rng, max_decode_len=max_decode_len, config=config
      ),
      _REPEATS.value,
      warm_up=warm_up,
  )
  base = jax.device_get(base)
  totals["baseline"]["tokens"] += int(base.lengths[:num_real].sum())
  totals["baseline"]["seconds"] += seconds
  for name, gamma, verifier, threshold in variants:
    result, seconds = timing.timed(
        lambda: decoders.speculative(
            placed,
            rng,
            gamma=gamma,  # pylint: disable=cell-var-from-loop
            max_decode_len=max_decode_len,
            config=config,
            verifier=verifier,  # pylint: disable=cell-var-from-loop
            draft_threshold=threshold,  # pylint: disable=cell-var-from-loop
        ),
        _REPEATS.value,
        warm_up=warm_up,
    )
    result = jax.device_get(result)
    real = slice(0, num_real)
    total = totals[name]
    total["tokens"] += int(result.lengths[real].sum())
    total["target_calls"] += int(result.target_calls[real].sum())
    total["draft_calls"] += int(result.draft_calls[real].sum())
    total["seconds"] += seconds
    total["diff"] += int(
        np.sum(np.any(result.sequences[real] != base.sequences[real], 1))
    )


def _rows(totals, variants, baseline_ms, greedy):
  """The table's row (a dict) of each variant, from its `totals`."""
  rows = []
  for name, gamma, verifier, threshold in variants:
    total = totals[name]
    ms = 1e3 * total["seconds"] / total["tokens"]
    rows.append(
        dict(
            variant=name,
            gamma=gamma,
            verifier=verifier,
            draft_threshold=threshold,
            tokens_per_target_call=total["tokens"] / total["target_calls"],
            draft_calls_per_target_call=(
                total["draft_calls"] / total["target_calls"]
            ),
            ms_per_token=ms,
            speedup=baseline_ms / ms,
            greedy_rows_differing=total["diff"] if greedy else None,
        )
    )
  return rows


def _setting(decoders, tokens, temperature, batch_size):
  """Decodes every batch with the baseline and every variant.

  Returns:
    The setting's JSON record: its seed, temperature and batch size, the
    baseline's ms per token, 'auto's calibration and `_rows`.
  """
  config = sampling.SamplingConfig(temperature=temperature)
  batches = _placed_batches(decoders, tokens, batch_size)
  auto = _calibrate(decoders, batches, config)
  variants = _variants(auto.gamma)
  totals = {
      name: dict(tokens=0, target_calls=0, draft_calls=0, seconds=0.0, diff=0)
      for name in ["baseline"] + [v[0] for v in variants]
  }
  seen_shapes = set()
  for index, batch in enumerate(batches):
    placed, _ = batch
    warm_up = placed.shape not in seen_shapes
    seen_shapes.add(placed.shape)
    _add_batch(totals, decoders, batch, index, config, variants, warm_up)
  baseline_ms = (
      1e3 * totals["baseline"]["seconds"] / totals["baseline"]["tokens"]
  )
  return dict(
      seed=_SEED.value,
      temperature=temperature,
      batch_size=batch_size,
      baseline_ms_per_token=baseline_ms,
      calibration=auto.to_json(),
      rows=_rows(totals, variants, baseline_ms, config.greedy),
  )


def _markdown(setting):
  lines = [
      f"temperature {setting['temperature']:g}, batch {setting['batch_size']}"
      f": baseline {setting['baseline_ms_per_token']:.3f} ms/token; auto "
      f"chose gamma {setting['calibration']['gamma']} at alpha "
      f"{setting['calibration']['alpha']:.3f}",
      "",
      "| variant | tokens / target call | draft calls / target call | "
      "ms / token | speedup | greedy rows differing |",
      "|---|---|---|---|---|---|",
  ]
  for row in setting["rows"]:
    differing = row["greedy_rows_differing"]
    lines.append(
        f"| {row['variant']} | {row['tokens_per_target_call']:.3f} | "
        f"{row['draft_calls_per_target_call']:.2f} | "
        f"{row['ms_per_token']:.3f} | {row['speedup']:.3f}x | "
        f"{'-' if differing is None else differing} |"
    )
  return "\n".join(lines)


def main(argv):
  with cli.one_line_errors():
    cli.start(argv)
    texts = inputs_lib.read_inputs()
    # run.vocabulary, as the gin files bind it.
    vocabulary = gin.query_parameter("run.vocabulary").scoped_configurable_fn()
    tokens = inputs_lib.encode(texts, vocabulary, 64).tokens
    mesh = partitioning.make_mesh()
    target = pair.load_model("target", mesh)
    draft = pair.load_model("draft", mesh)
    decoders = engine.Engine(
        mesh, target.model, target.params, draft.model, draft.params
    )
    settings = []
    for temperature in _TEMPERATURES.value:
      for batch_size in _BATCH_SIZES.value:
        setting = _setting(
            decoders, tokens, float(temperature), int(batch_size)
        )
        settings.append(setting)
        print(_markdown(setting) + "\n", flush=True)
        with open(_OUTPUT.value, "w") as f:
          json.dump(
              dict(num_examples=len(texts), settings=settings), f, indent=1
          )
        engine.clear_compiled()


if __name__ == "__main__":
  app.run(main)
