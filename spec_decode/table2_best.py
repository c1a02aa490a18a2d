"""The best gamma of each group of a Table 2 sweep's points.

A group is the points of one (task, temperature, batch size, draft,
verifier, draft threshold), over their gammas. `best_gammas` gives each
group's best gamma, measured and by Theorem 3.8, for table2.json and the
report; `groups` and `call_cost_speedup` serve the report and the plot too.
"""

import dataclasses
import statistics

from spec_decode import analysis
from spec_decode import table2_points


def groups(rows):
  """Rows grouped by (task, temperature, batch size, draft, verifier, draft
  threshold), in sweep order."""
  grouped = {}
  for row in rows:
    point = table2_points.from_row(row)
    key = dataclasses.astuple(dataclasses.replace(point, gamma=0))
    grouped.setdefault(key[:4] + key[5:], []).append(row)
  return grouped


def best_gammas(rows):
  """The best gamma of each (task, temperature, batch size, draft).

  Args:
    rows: the sweep's points (`sweep`'s table2.json 'points').

  Returns:
    One dict per group: its mean alpha and median c over its gammas; the
    swept gamma with the highest measured speedup (and what its measured
    call costs allow), and the one with the highest Theorem 3.8 speedup;
    and Theorem 3.8's optimal gamma in 1..64 at the mean alpha and median c
    (`analysis.optimal_gamma`).
  """
  best = []
  for key, group in groups(rows).items():
    task, temperature, batch_size, draft, verifier, draft_threshold = key
    alpha = statistics.mean(row["alpha"] for row in group)
    c = statistics.median(row["c"] for row in group)
    measured = max(group, key=lambda row: row["speedup"])
    calls = call_cost_speedup(measured)
    predicted = max(group, key=lambda row: row["predicted_speedup"])
    best.append(
        dict(
            task=task,
            temperature=temperature,
            batch_size=batch_size,
            draft=draft,
            verifier=verifier,
            draft_threshold=draft_threshold,
            alpha=alpha,
            c=c,
            measured_gamma=measured["gamma"],
            measured_gamma_policy=measured.get("gamma_policy", "fixed"),
            measured_speedup=measured["speedup"],
            call_cost_speedup=calls,
            predicted_gamma=predicted["gamma"],
            predicted_speedup=predicted["predicted_speedup"],
            optimal_gamma=analysis.optimal_gamma(alpha, c),
        )
    )
  return best


def call_cost_speedup(row):
  """What the point's measured call costs allow (`analysis`)."""
  return analysis.call_cost_speedup(
      row["tokens_per_target_call"],
      row["gamma"],
      row["target_step_ms"],
      row["target_verify_ms"],
      row["draft_step_ms"],
  )
