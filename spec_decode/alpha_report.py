"""What `spec_decode.alpha` prints and writes: its estimates as a table and
as JSON, each kept as it comes, so that Ctrl-C or a failure at a later
temperature loses none. (Apart from alpha.py, whose flags a test process
that imports another command's module could not define twice.)"""

import dataclasses
import json
import pathlib

from spec_decode import run_outputs
from spec_decode import teacher_forced


def format_estimates(estimates):
  """One line per temperature: alpha, its error, tokens per call by gamma."""
  header = "temperature  alpha   s.e.    positions  tokens/call at gamma " + (
      " ".join(f"{g:>5d}" for g in teacher_forced.GAMMAS)
  )
  lines = [header]
  for e in estimates:
    calls = " ".join(f"{t:5.2f}" for t in e.tokens_per_call().values())
    lines.append(
        f"{e.temperature:<11g}  {e.alpha:.3f}  {e.standard_error:.4f}  "
        f"{e.positions:>9d}  {'':20s} {calls}"
    )
  return "\n".join(lines)


def kept_estimates(measure, num_configs, output):
  """Runs `measure`, keeping each estimate as it comes: none is lost to
  Ctrl-C or a failure at a later temperature.

  Args:
    measure: `teacher_forced.measure` with its arguments but on_estimate.
    num_configs: the temperatures measured.
    output: where the estimates so far are written (JSON) after each one,
      or None.

  Returns:
    The AlphaEstimates.

  Raises:
    KeyboardInterrupt: on Ctrl-C, after printing the estimates made so far,
      saying where they are.
  """
  estimates = []

  def keep(estimate):
    estimates.append(estimate)
    if output:
      records = [
          {**dataclasses.asdict(e), "tokens_per_call": e.tokens_per_call()}
          for e in estimates
      ]
      run_outputs.write_atomically(
          pathlib.Path(output), json.dumps(records, indent=2) + "\n"
      )

  try:
    measure(on_estimate=keep)
  except KeyboardInterrupt:
    if not estimates:
      raise
    print(format_estimates(estimates))
    where = f"; they are in {output}" if output else ""
    raise KeyboardInterrupt(
        f"after {len(estimates)} of {num_configs} temperatures{where}"
    ) from None
  return estimates
