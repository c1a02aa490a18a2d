"""What a run prints: its results as a table, and errors as one line."""

from spec_decode import machine as machine_lib

_ROWS = (
    ("examples", "num_examples", "{:d}"),
    ("gamma", "gamma", "{:d}"),
    ("temperature", "temperature", "{:g}"),
    ("alpha (accepted / drafted)", "alpha", "{:.3f}"),
    ("alpha estimate (mean sum min(p, q))", "alpha_estimate", "{:.3f}"),
    ("tokens per target call", "tokens_per_target_call", "{:.2f}"),
    ("  Eq. 1 at this alpha", "expected_tokens_per_target_call", "{:.2f}"),
    ("mean accepted length (vLLM's)", "mean_accepted_length", "{:.2f}"),
    ("baseline ms / token", "baseline_ms_per_token", "{:.2f}"),
    ("speculative ms / token", "speculative_ms_per_token", "{:.2f}"),
    ("speedup (measured)", "speedup", "{:.2f}x"),
    (
        "baseline set-up ms / batch (encoder, cache)",
        "baseline_setup_ms",
        "{:.2f}",
    ),
    ("speculative set-up ms / batch", "speculative_setup_ms", "{:.2f}"),
    ("speedup after set-up", "speedup_after_setup", "{:.2f}x"),
    ("c (draft step / target step)", "c", "{:.3f}"),
    (
        "target (gamma+1)-token call / 1-token call",
        "target_verify_over_step",
        "{:.2f}",
    ),
    ("speedup (Theorem 3.8)", "predicted_speedup", "{:.2f}x"),
    ("  with the measured call costs", "call_cost_speedup", "{:.2f}x"),
    (
        "    in the call costs' timed rounds",
        "call_cost_speedup_range",
        "{0[0]:.2f}-{0[1]:.2f}x",
    ),
    ("optimal gamma (Theorem 3.8)", "optimal_gamma", "{:d}"),
    ("greedy rows differing from baseline", "mismatches", "{:d}"),
    ("inputs truncated", "num_truncated", "{:d}"),
    ("rows with non-finite logits", "nonfinite_rows", "{:d}"),
)


def format_results(results):
  """The results dict of `compare.run` as aligned lines."""
  values = dict(results)
  values["target_verify_over_step"] = (
      results["target_verify_ms"] / results["target_step_ms"]
  )
  lines = []
  if "machine" in values:
    lines.append(f"{'machine':<45} {machine_lib.summary(values['machine'])}")
  for label, key, fmt in _ROWS:
    if values.get(key) is not None:
      lines.append(f"{label:<45} {fmt.format(values[key])}")
    if (
        key == "mean_accepted_length"
        and "acceptance_rate_by_position" in values
    ):
      rates = " ".join(
          f"{r:.2f}" for r in values["acceptance_rate_by_position"]
      )
      lines.append(f"{'  accepted at draft position 1..gamma':<45} {rates}")
  note = compute_bound_note(values)
  if note:
    lines.append(note)
  return "\n".join(lines)


def compute_bound_note(results):
  """A warning when the target's calls alone rule out a speedup, else None.

  Theorem 3.8 assumes that scoring gamma + 1 tokens costs one target step.
  Where the measured (gamma+1)-token call costs so many steps that even a
  loop with no cost of its own would be slower than the baseline
  (`call_cost_speedup` < 1), the target is compute-bound on this machine,
  and the report says so rather than leaving a bare slowdown.
  """
  if (
      results.get("call_cost_speedup") is None
      or results["call_cost_speedup"] >= 1
  ):
    return None
  ratio = results["target_verify_ms"] / results["target_step_ms"]
  return (
      f"note: here a {results['gamma'] + 1}-token target call costs "
      f"{ratio:.2f} one-token calls and yields "
      f"{results['tokens_per_target_call']:.2f} tokens, so the target is "
      "compute-bound on this machine and no loop can be faster than the "
      "baseline at this gamma; try a smaller run.gamma or run.gamma='auto' "
      "(README: The memory-bound demo target)"
  )


# The lines gin appends to an exception raised under it.
_GIN_CONTEXT = ("In call to configurable", "In bindings", "In file")


def _multiline(error):
  """Whether every line of the message counts (a list, a caret).

  Looks down the chain of causes: callers re-raise with a prefix (`pair`
  names the model), and gin re-raises with its context.
  """
  while error is not None:
    if getattr(error, "multiline", False):
      return True
    error = error.__cause__
  return False


def joined(error):
  """An exception's whole message joined into one line, without gin's context
  (for messages that wrap one sentence over lines, as TensorFlow's do)."""
  return " ".join(
      line.strip()
      for line in str(error).splitlines()
      if line.strip() and not line.strip().startswith(_GIN_CONTEXT)
  )


def one_line(error):
  """An exception's message on one line (gin adds the binding's location).

  An error marked `multiline` (a checkpoint's list of mismatches, a syntax
  error's caret) keeps all its lines, without gin's context.
  """
  if _multiline(error):
    lines = str(error).rstrip().splitlines()
    return "\n".join(
        line for line in lines if not line.strip().startswith(_GIN_CONTEXT)
    )
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  if not lines:
    return type(error).__name__
  where = [
      line for line in lines[1:] if line.startswith(("In bindings", "In file"))
  ]
  return "; ".join(lines[:1] + where[:1])
