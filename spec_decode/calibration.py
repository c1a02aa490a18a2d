"""gamma = 'auto': gamma chosen from a short calibration with measured costs.

Theorem 3.8 of Leviathan et al. picks gamma from alpha and c, assuming that
the target scores gamma + 1 tokens in the time of one step. Where that fails
(a compute-bound target, such as the demo pair on a CPU) its optimum drafts
too much. The calibration instead measures, on the run's first batches:

- alpha, as the mean of beta = sum_x min(p, q) over the positions judged
  (Corollary 3.6), which does not depend on gamma or the verifier;
- the time of the target's (g+1)-token call for every g in 1..max_gamma, of
  its 1-token call and of a draft step, in-graph (`timing.seconds_per_call`);

and picks the g that maximizes Eq. 1's tokens per call times the 1-token
call's time over the iteration's measured time (`analysis.call_cost_speedup`).
Eq. 1 is the token-wise verifier's count; block verification only adds to
it, so the choice errs, if at all, towards shorter drafts.
"""

import dataclasses

import jax

from spec_decode import analysis
from spec_decode import partitioning
from spec_decode import timing

# Timed loops of decode calls per measured cost; the median counts.
_REPEATS = 5


@dataclasses.dataclass(frozen=True)
class Calibration:
  """What the calibration measured and chose.

  Attributes:
    gamma: the chosen gamma.
    alpha: the mean beta over the calibration's judged positions.
    target_step: seconds of a 1-token target call.
    draft_step: seconds of a 1-token draft call.
    verify_calls: seconds of the target's (g+1)-token call, g = 1..max_gamma.
    predicted_speedups: `analysis.call_cost_speedup` at each g.
  """

  gamma: int
  alpha: float
  target_step: float
  draft_step: float
  verify_calls: tuple[float, ...]
  predicted_speedups: tuple[float, ...]

  def to_json(self):
    return dataclasses.asdict(self)


def choose_gamma(alpha, target_step, draft_step, verify_calls):
  """The g in 1..len(verify_calls) of the highest predicted speedup.

  Args:
    alpha: the acceptance rate, in [0, 1].
    target_step: seconds of a 1-token target call.
    draft_step: seconds of a draft step.
    verify_calls: seconds of the (g+1)-token target call, g = 1, 2, ...

  Returns:
    The gamma (the smallest on ties) and the predicted speedups.
  """
  speedups = tuple(
      analysis.call_cost_speedup(
          analysis.expected_tokens_per_call(alpha, gamma),
          gamma,
          target_step,
          verify_call,
          draft_step,
      )
      for gamma, verify_call in enumerate(verify_calls, start=1)
  )
  return speedups.index(max(speedups)) + 1, speedups


def calibrate(
    decoders, batches, *, max_gamma, max_decode_len, config, verifier, rng
) -> Calibration:
  """Measures alpha and the call costs on `batches`, and chooses gamma.

  Args:
    decoders: an engine.Engine.
    batches: placed int32 [B, S] input batches (the run's first ones).
    max_gamma: the largest gamma considered, >= 1.
    max_decode_len: most tokens per row.
    config: the sampling config.
    verifier: the run's verifier.
    rng: a PRNG key; batch i decodes with fold_in(rng, i).

  Returns:
    The Calibration.
  """
  beta = judged = 0.0
  for index, inputs in enumerate(batches):
    result = jax.device_get(
        decoders.speculative(
            inputs,
            jax.random.fold_in(rng, index),
            gamma=max_gamma,
            max_decode_len=max_decode_len,
            config=config,
            verifier=verifier,
        )
    )
    beta += float(result.beta_sum.sum())
    judged += int(result.drafted_tokens.sum())
  alpha = min(max(beta / max(judged, 1), 0.0), 1.0)

  position = max_decode_len // 2
  target, draft = decoders.speculative_setup(
      batches[0], gamma=max_gamma, max_decode_len=max_decode_len
  )

  def seconds(model, num_tokens):
    return timing.seconds_per_call(
        model.decode_fn, model.cache, num_tokens, position, repeats=_REPEATS
    )

  with partitioning.active(decoders.mesh, decoders.target_rules):
    target_step = seconds(target, 1)
    draft_step = seconds(draft, 1)
    verify_calls = tuple(
        seconds(target, gamma + 1) for gamma in range(1, max_gamma + 1)
    )
  gamma, speedups = choose_gamma(alpha, target_step, draft_step, verify_calls)
  return Calibration(
      gamma=gamma,
      alpha=alpha,
      target_step=target_step,
      draft_step=draft_step,
      verify_calls=verify_calls,
      predicted_speedups=speedups,
  )
