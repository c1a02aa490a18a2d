r"""The speculative loop's own cost, with the target as its own draft.

With draft == target every drafted token is accepted (alpha = 1), so each
iteration emits gamma + 1 tokens for gamma draft calls and one target call on
gamma + 1 tokens. On the tiny T5 (random weights) this prints, per batch size
and gamma:

- the baseline's and the speculative decoder's ms per emitted token, and the
  measured speedup (baseline / speculative);
- c, a draft step's time over a target step's (both one-token calls, so about
  1 here), and Theorem 3.8's speedup for alpha = 1 and that c;
- verify / step: the time of the target's (gamma + 1)-token call over a
  one-token step's. Theorem 3.8 assumes 1 (decoding is memory bound);
- the loop's overhead, in ms per token: the speculative time minus that of the
  model calls it makes, (gamma * draft step + verify call) / (gamma + 1), and
  the baseline's time minus one step.

Each model call is timed alone, in a jitted loop of 64 such calls that carries
the cache as the decoders do.

Both decoders run greedily on the same inputs, with no EOS, so they emit
max_decode_len tokens per row; "same tokens" is the fraction of them that
agree (below 1 only where a (gamma + 1)-token pass and a one-token pass round a
near-tie differently, e.g. under TF32 or bfloat16 matmuls). Times are medians
of repeated runs after a warm-up run that compiles.

Usage:
  python benchmarks/loop_overhead.py --batch_sizes=1,8 --max_decode_len=64
"""

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import analysis
from spec_decode import decoding
from spec_decode import drafts
from spec_decode import gin_config
from spec_decode import sampling
from spec_decode import timing
from spec_decode import speculative
from spec_decode.models import t5

_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "8"], "Batch sizes.")
_GAMMAS = flags.DEFINE_list(
    "gammas", [str(gamma) for gamma in range(1, 9)], "Draft lengths."
)
_MAX_DECODE_LEN = flags.DEFINE_integer("max_decode_len", 64, "Tokens per row.")
_INPUT_LEN = flags.DEFINE_integer("input_len", 16, "Encoder input length.")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed runs; the median counts.")
_CALLS = flags.DEFINE_integer("calls", 64, "Calls per timed model-call loop.")
_MODEL_GIN = flags.DEFINE_string(
    "model_gin", "models/t5_1_1_tiny.gin", "Model config, under configs/."
)

# No token id is negative: the rows never stop early, so both decoders emit
# max_decode_len tokens per row.
_NO_EOS = -1
_GREEDY = sampling.SamplingConfig(temperature=0.0)


def main(argv):
  del argv
  gin_config.parse([_MODEL_GIN.value])
  config = t5.T5Config()
  model = t5.Transformer(config)
  params = t5.init_params(config, jax.random.key(0))
  max_decode_len, repeats = _MAX_DECODE_LEN.value, _REPEATS.value
  print(f"device: {jax.devices()[0].device_kind}, model: {_MODEL_GIN.value}")
  print(
      "batch gamma | base ms/tok  spec ms/tok  speedup |    c  Thm3.8 |"
      " verify/step | overhead ms/tok: base   spec | same tokens"
  )
  for batch_size in [int(size) for size in _BATCH_SIZES.value]:
    inputs = np.random.default_rng(0).integers(
        2, config.vocab_size, (batch_size, _INPUT_LEN.value)
    )
    baseline_model = drafts.t5_draft(model, params, inputs, max_decode_len)
    baseline = lambda: decoding.autoregressive_decode(
        baseline_model.decode_fn,
        baseline_model.cache,
        jax.random.key(0),
        max_decode_len=max_decode_len,
        eos_id=_NO_EOS,
        config=_GREEDY,
    )
    baseline_per_token = (
        timing.median_seconds(baseline, repeats) / max_decode_len
    )
    step = timing.seconds_per_call(
        baseline_model.decode_fn,
        baseline_model.cache,
        1,
        max_decode_len // 2,
        repeats=repeats,
        calls=_CALLS.value,
    )
    expected = np.asarray(baseline().sequences)
    for gamma in [int(gamma) for gamma in _GAMMAS.value]:
      target = drafts.t5_draft(
          model, params, inputs, max_decode_len + gamma + 1
      )
      draft = drafts.target_as_draft(target.decode_fn, target.cache)
      run = lambda: speculative.speculative_decode(
          target.decode_fn,
          draft.decode_fn,
          target.cache,
          draft.cache,
          jax.random.key(0),
          gamma=gamma,
          max_decode_len=max_decode_len,
          eos_id=_NO_EOS,
          config=_GREEDY,
      )
      same = float(np.mean(np.asarray(run().sequences) == expected))
      speculative_per_token = (
          timing.median_seconds(run, repeats) / max_decode_len
      )
      # Timed back to back, so that a shared machine's load drifts less.
      draft_step, target_step, verify_call = (
          timing.seconds_per_call(
              fn,
              cache,
              num_tokens,
              max_decode_len // 2,
              repeats=repeats,
              calls=_CALLS.value,
          )
          for fn, cache, num_tokens in [
              (draft.decode_fn, draft.cache, 1),
              (target.decode_fn, target.cache, 1),
              (target.decode_fn, target.cache, gamma + 1),
          ]
      )
      c = draft_step / target_step
      model_per_token = (gamma * draft_step + verify_call) / (gamma + 1)
      print(
          f"{batch_size:5d} {gamma:5d} | {1e3 * baseline_per_token:11.3f}"
          f"  {1e3 * speculative_per_token:11.3f}"
          f"  {baseline_per_token / speculative_per_token:7.2f} |"
          f" {c:4.2f}  {analysis.walltime_improvement(1.0, gamma, c):6.2f} |"
          f" {verify_call / target_step:11.2f} |"
          f" {1e3 * (baseline_per_token - step):20.3f}"
          f" {1e3 * (speculative_per_token - model_per_token):6.3f} |"
          f" {same:11.4f}",
          flush=True,
      )


if __name__ == "__main__":
  app.run(main)
