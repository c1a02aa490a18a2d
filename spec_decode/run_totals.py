"""A run's counts over its batches, and the report made of them."""

import dataclasses

import jax
import numpy as np

from spec_decode import acceptance
from spec_decode import analysis


@dataclasses.dataclass
class RunTotals:
  """Sums over the real rows of every batch of a run.

  Attributes:
    gamma: tokens drafted per target call (the most, with early stop).
    baseline_tokens: tokens the baseline emitted.
    speculative_tokens: tokens the speculative decoder emitted.
    target_calls: its target calls.
    drafted: drafted tokens the target judged.
    accepted: drafted tokens it accepted.
    beta: the sum of beta = sum_x min(p, q) over the judged drafts.
    mismatches: rows whose two outputs differ (greedy: must stay 0).
    draft_calls: draft calls made.
    nonfinite_rows: rows with NaN or infinite target logits.
    accepted_by_position: int64 [gamma] target calls whose i-th draft was
      accepted.
  """

  gamma: int
  baseline_tokens: int = 0
  speculative_tokens: int = 0
  target_calls: int = 0
  drafted: int = 0
  accepted: int = 0
  beta: float = 0.0
  mismatches: int = 0
  draft_calls: int = 0
  nonfinite_rows: int = 0
  accepted_by_position: np.ndarray = None

  def __post_init__(self):
    self.accepted_by_position = np.zeros((self.gamma,), np.int64)

  def add(self, base, spec, num_real):
    """Adds one batch's results (host arrays) over its first num_real rows.

    Returns:
      bool [num_real], the rows whose two outputs are identical, and bool
      [num_real], the rows with non-finite target logits.
    """
    real = slice(0, num_real)
    self.baseline_tokens += int(base.lengths[real].sum())
    self.speculative_tokens += int(spec.lengths[real].sum())
    self.target_calls += int(spec.target_calls[real].sum())
    self.drafted += int(spec.drafted_tokens[real].sum())
    self.accepted += int(spec.accepted_tokens[real].sum())
    self.beta += float(spec.beta_sum[real].sum())
    self.draft_calls += int(spec.draft_calls[real].sum())
    blocks = acceptance.result_blocks(jax.tree.map(lambda x: x[real], spec))
    self.accepted_by_position += acceptance.rates_by_position(
        (block for row_blocks in blocks for block in row_blocks), self.gamma
    ).accepted
    nonfinite = base.nonfinite[real] | spec.nonfinite[real]
    self.nonfinite_rows += int(nonfinite.sum())
    same = np.all(base.sequences[real] == spec.sequences[real], axis=1)
    self.mismatches += int(np.sum(~same))
    return same, nonfinite


@dataclasses.dataclass
class Seconds:
  """A run's timed seconds, each the sum over its batches of their medians.

  Attributes:
    baseline: the baseline decoder, its set-up included.
    speculative: the speculative decoder, its set-up included.
    baseline_setup: the baseline's set-up alone (the target's encoder and
      cache), which Theorem 3.8 leaves out.
    speculative_setup: the speculative decoder's set-up alone (both caches).
    batches: the batches timed.
  """

  baseline: float = 0.0
  speculative: float = 0.0
  baseline_setup: float = 0.0
  speculative_setup: float = 0.0
  batches: int = 0

  def add(self, batch):
    """Adds one batch's Seconds (its `batches` 1)."""
    for field in dataclasses.fields(self):
      name = field.name
      setattr(self, name, getattr(self, name) + getattr(batch, name))


def _times(totals, seconds):
  """The report's times: each decoder's per token, its set-up's per batch,
  and the speedups with and without the set-ups."""
  baseline_ms = 1e3 * seconds.baseline / totals.baseline_tokens
  speculative_ms = 1e3 * seconds.speculative / totals.speculative_tokens
  batches = max(seconds.batches, 1)
  # Each decoder's time less its set-up's: what Theorem 3.8 models.
  baseline_loop_ms = (
      1e3 * (seconds.baseline - seconds.baseline_setup) / totals.baseline_tokens
  )
  speculative_loop_ms = (
      1e3
      * (seconds.speculative - seconds.speculative_setup)
      / totals.speculative_tokens
  )
  return {
      "baseline_ms_per_token": baseline_ms,
      "speculative_ms_per_token": speculative_ms,
      "speedup": baseline_ms / speculative_ms,
      "baseline_setup_ms": 1e3 * seconds.baseline_setup / batches,
      "speculative_setup_ms": 1e3 * seconds.speculative_setup / batches,
      "speedup_after_setup": baseline_loop_ms / speculative_loop_ms,
  }


def results(
    totals,
    seconds,
    costs,
    gamma,
    config,
    num_examples,
    num_truncated,
):
  """The report: what the paper measures, from a run's totals.

  Args:
    totals: the run's RunTotals.
    seconds: the run's Seconds.
    costs: the call_costs.StepCosts measured.
    gamma: tokens drafted per target call.
    config: the SamplingConfig.
    num_examples: inputs decoded.
    num_truncated: inputs cut to fit.

  Returns:
    The results dict (`results.json`).
  """
  drafted = max(totals.drafted, 1)
  calls = max(totals.target_calls, 1)
  alpha = totals.accepted / drafted
  return {
      "num_examples": num_examples,
      "num_truncated": num_truncated,
      "gamma": gamma,
      "temperature": config.temperature,
      "top_k": config.top_k,
      "top_p": config.top_p,
      "alpha": alpha,
      "alpha_estimate": totals.beta / drafted,
      "tokens_per_target_call": (
          totals.speculative_tokens / totals.target_calls
      ),
      "expected_tokens_per_target_call": analysis.expected_tokens_per_call(
          alpha, gamma
      ),
      **_times(totals, seconds),
      "c": costs.c,
      "target_step_ms": 1e3 * costs.target_step,
      "target_verify_ms": 1e3 * costs.target_verify,
      "draft_step_ms": 1e3 * costs.draft_step,
      "predicted_speedup": analysis.walltime_improvement(alpha, gamma, costs.c),
      "call_cost_speedup": _call_cost_speedup(
          costs, totals.speculative_tokens / calls, gamma
      ),
      "call_cost_speedup_range": _call_cost_range(
          costs, totals.speculative_tokens / calls, gamma
      ),
      "optimal_gamma": analysis.optimal_gamma(alpha, costs.c),
      "mismatches": totals.mismatches if config.greedy else None,
      "nonfinite_rows": totals.nonfinite_rows,
      # vLLM's definitions: per target call (a block of drafts), the share
      # of calls whose i-th draft was accepted, and 1 + accepted drafts.
      "acceptance_rate_by_position": [
          int(n) / calls for n in totals.accepted_by_position
      ],
      "mean_accepted_length": 1 + totals.accepted / calls,
      "baseline_tokens": totals.baseline_tokens,
      "speculative_tokens": totals.speculative_tokens,
      "target_calls": totals.target_calls,
      "drafted_tokens": totals.drafted,
      "accepted_tokens": totals.accepted,
  }


def _call_cost_speedup(costs, tokens_per_call, gamma):
  return analysis.call_cost_speedup(
      tokens_per_call,
      gamma,
      costs.target_step,
      costs.target_verify,
      costs.draft_step,
  )


def _call_cost_range(costs, tokens_per_call, gamma):
  """[least, most] call-cost speedup of the costs' timed rounds, each
  round's three calls timed in turn: how far the host's drift moves the
  prediction within a run. None where the costs have no rounds."""
  if not costs.rounds:
    return None
  speedups = [
      _call_cost_speedup(r, tokens_per_call, gamma) for r in costs.rounds
  ]
  return [min(speedups), max(speedups)]
