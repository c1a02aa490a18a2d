"""What one decode call of each model costs: the paper's c, and more.

Theorem 3.8 needs c, a draft step's time over a target step's; the
call-cost model (`analysis.call_cost_speedup`) also needs the target's
(gamma+1)-token verify call, which costs one step only where the target is
memory-bound.
"""

import dataclasses

import numpy as np

from spec_decode import partitioning
from spec_decode import timing

# Timed rounds of the three call loops, in turn; the medians count.
_ROUNDS = 7


@dataclasses.dataclass(frozen=True)
class StepCosts:
  """Measured times of single decode calls, in seconds.

  Attributes:
    target_step: the target on 1 token per row.
    target_verify: the target on gamma + 1 tokens per row.
    draft_step: the draft on 1 token per row.
  """

  target_step: float
  target_verify: float
  draft_step: float
  # Where `measure` made them medians: each timed round's costs, in turn.
  rounds: tuple["StepCosts", ...] = ()

  @property
  def c(self):
    """The paper's cost ratio: a draft step over a target step."""
    return self.draft_step / self.target_step


def measure(decoders, inputs, gamma, max_decode_len):
  """Times the target's 1- and (gamma+1)-token calls and a draft step.

  Each is a jitted loop of `timing.CALLS_PER_LOOP` calls, and the three
  loops run in turn (`timing.interleaved_times`): on a shared host the
  load drifts within seconds, and timed one after the other, the verify
  call's cost over the step's moved from 1.05 to 1.47 between runs of the
  demo.

  Args:
    decoders: an engine.Engine.
    inputs: int32 [B, S] placed inputs.
    gamma: tokens drafted per target call.
    max_decode_len: most tokens per row; calls start at half of it, a
      typical cache length during decoding.

  Returns:
    StepCosts: each call's median over the rounds, and each round's costs.
  """
  position = max_decode_len // 2
  target, draft = decoders.speculative_setup(
      inputs, gamma=gamma, max_decode_len=max_decode_len
  )
  runs = {
      "target_step": timing.call_loop(
          target.decode_fn, target.cache, 1, position
      ),
      "target_verify": timing.call_loop(
          target.decode_fn, target.cache, gamma + 1, position
      ),
      "draft_step": timing.call_loop(draft.decode_fn, draft.cache, 1, position),
  }
  with partitioning.active(decoders.mesh, decoders.target_rules):
    seconds = timing.interleaved_times(runs, _ROUNDS)
  per_call = {
      name: np.asarray(s) / timing.CALLS_PER_LOOP for name, s in seconds.items()
  }
  return StepCosts(
      **{name: float(np.median(s)) for name, s in per_call.items()},
      rounds=tuple(
          StepCosts(**{name: float(s[r]) for name, s in per_call.items()})
          for r in range(_ROUNDS)
      ),
  )
