"""What a run prints: its results as a table, and errors as one line."""

_ROWS = (
    ("examples", "num_examples", "{:d}"),
    ("gamma", "gamma", "{:d}"),
    ("temperature", "temperature", "{:g}"),
    ("alpha (accepted / drafted)", "alpha", "{:.3f}"),
    ("alpha estimate (mean sum min(p, q))", "alpha_estimate", "{:.3f}"),
    ("tokens per target call", "tokens_per_target_call", "{:.2f}"),
    ("  Eq. 1 at this alpha", "expected_tokens_per_target_call", "{:.2f}"),
    ("baseline ms / token", "baseline_ms_per_token", "{:.2f}"),
    ("speculative ms / token", "speculative_ms_per_token", "{:.2f}"),
    ("speedup (measured)", "speedup", "{:.2f}x"),
    ("c (draft step / target step)", "c", "{:.3f}"),
    (
        "target (gamma+1)-token call / 1-token call",
        "target_verify_over_step",
        "{:.2f}",
    ),
    ("speedup (Theorem 3.8)", "predicted_speedup", "{:.2f}x"),
    ("optimal gamma (Theorem 3.8)", "optimal_gamma", "{:d}"),
    ("greedy rows differing from baseline", "mismatches", "{:d}"),
    ("inputs truncated", "num_truncated", "{:d}"),
)


def format_results(results):
  """The results dict of `compare.run` as aligned lines."""
  values = dict(results)
  values["target_verify_over_step"] = (
      results["target_verify_ms"] / results["target_step_ms"]
  )
  lines = []
  for label, key, fmt in _ROWS:
    if values.get(key) is not None:
      lines.append(f"{label:<45} {fmt.format(values[key])}")
  return "\n".join(lines)


def one_line(error):
  """An exception's message on one line (gin adds the binding's location)."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  if not lines:
    return type(error).__name__
  where = [
      line for line in lines[1:] if line.startswith(("In bindings", "In file"))
  ]
  return "; ".join(lines[:1] + where[:1])
