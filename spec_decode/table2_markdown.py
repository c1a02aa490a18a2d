"""A Table 2 sweep's report as Markdown: table2.md, what the benchmark prints.

Two tables: a row per point, then a row per group with its best gamma,
measured and by Theorem 3.8 (`table2_best.best_gammas`).
"""

from spec_decode import table2_best
from spec_decode import table2_points


def _gamma_text(gamma, policy):
  return f"auto ({gamma})" if policy == "auto" else str(gamma)


def _verifier_text(verifier, draft_threshold):
  if draft_threshold:
    return f"{verifier}, stop < {draft_threshold:g}"
  return verifier


def _table(header, rows):
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(row) + " |" for row in rows]
  return "\n".join(lines)


def _points_table(rows):
  """A row per point."""
  return _table(
      (
          "task",
          "T",
          "batch",
          "draft",
          "gamma",
          "verifier",
          "alpha",
          "tokens / call",
          "speedup",
          "Thm 3.8",
          "call costs",
          "c",
          "Thm 3.8 optimal gamma",
      ),
      [
          (
              row["task"],
              f"{row['temperature']:g}",
              str(row["batch_size"]),
              row["draft"],
              _gamma_text(row["gamma"], row.get("gamma_policy")),
              _verifier_text(
                  table2_points.from_row(row).verifier,
                  table2_points.from_row(row).draft_threshold,
              ),
              f"{row['alpha']:.3f}",
              f"{row['tokens_per_target_call']:.2f}",
              f"{row['speedup']:.2f}x",
              f"{row['predicted_speedup']:.2f}x",
              f"{table2_best.call_cost_speedup(row):.2f}x",
              f"{row['c']:.3f}",
              str(row["optimal_gamma"]),
          )
          for row in rows
      ],
  )


def _best_table(best):
  """A row per group: its best gamma, measured and by Theorem 3.8."""
  return _table(
      (
          "task",
          "T",
          "batch",
          "draft",
          "verifier",
          "mean alpha",
          "median c",
          "best gamma, measured",
          "call costs there",
          "best swept gamma, Thm 3.8",
          "Thm 3.8 optimal gamma",
      ),
      [
          (
              group["task"],
              f"{group['temperature']:g}",
              str(group["batch_size"]),
              group["draft"],
              _verifier_text(group["verifier"], group["draft_threshold"]),
              f"{group['alpha']:.3f}",
              f"{group['c']:.3f}",
              _gamma_text(
                  group["measured_gamma"], group["measured_gamma_policy"]
              )
              + f" ({group['measured_speedup']:.2f}x)",
              f"{group['call_cost_speedup']:.2f}x",
              f"{group['predicted_gamma']} "
              f"({group['predicted_speedup']:.2f}x)",
              str(group["optimal_gamma"]),
          )
          for group in best
      ],
  )


def markdown(rows, best):
  """The report: a row per point, then each group's best gamma."""
  points_table = _points_table(rows)
  best_table = _best_table(best)
  greedy = [row["mismatches"] for row in rows if row["mismatches"] is not None]
  examples = sorted({row["num_examples"] for row in rows})
  return (
      "## Every point\n\n"
      f"{points_table}\n\n"
      f"Inputs per point: {', '.join(map(str, examples))}. Greedy rows "
      f"differing from the baseline: {sum(greedy)} over {len(greedy)} greedy "
      "points.\n\n"
      "## Best gamma: measured and Theorem 3.8\n\n"
      f"{best_table}\n\n"
      "Theorem 3.8's optimal gamma (in 1..64) is at the group's mean alpha "
      "and median c. 'Call costs' is Theorem 3.8 with the point's measured "
      "(gamma+1)-token target call in place of one step and its measured "
      "tokens per call: what a loop that adds no time of its own would "
      "reach.\n"
  )
