"""The paper's formulas for speculative decoding's expected gains.

Leviathan, Kalman & Matias, ICML 2023 (arXiv:2211.17192), section 3:

- Eq. 1: expected tokens per target call, (1 - a^(g+1)) / (1 - a).
- Theorem 3.8: expected walltime improvement,
  (1 - a^(g+1)) / ((1 - a)(g c + 1)).
- The optimal gamma: the integer maximizing Theorem 3.8 (section 3.5).
- Theorem 3.11: expected factor of increase in arithmetic operations,
  (1 - a)(g c_hat + g + 1) / (1 - a^(g+1)).

Here a is alpha (the acceptance rate, E[sum_x min(p(x), q(x))]), g is gamma
(tokens drafted per target call), c is the ratio of a draft step's time to a
target step's, and c_hat the ratio of their arithmetic operations per token.
"""

import numpy as np

from spec_decode import checks

# Largest gamma `optimal_gamma` considers by default. With alpha = 1 the
# improvement grows without bound in gamma (towards 1 / c), so a cap is needed;
# 64 is far beyond the paper's gammas (at most 10).
_MAX_GAMMA = 64


def _check(alpha: float, gamma: int) -> None:
  if not 0 <= alpha <= 1:
    raise ValueError(f"alpha must be in [0, 1], got {alpha}.")
  if not checks.is_integer(gamma) or gamma < 0:
    raise ValueError(f"gamma must be an int >= 0, got {gamma!r}.")


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
  """Eq. 1: expected tokens emitted per target call.

  Args:
    alpha: The acceptance rate, in [0, 1].
    gamma: Tokens drafted per target call, >= 0.

  Returns:
    (1 - alpha^(gamma+1)) / (1 - alpha), which tends to gamma + 1 as alpha
    tends to 1.
  """
  _check(alpha, gamma)
  if alpha == 1:
    return float(gamma + 1)
  # The geometric sum 1 + a + ... + a^g, which equals the closed form above
  # without its cancellation near alpha = 1.
  return float(np.sum(alpha ** np.arange(gamma + 1)))


def walltime_improvement(alpha: float, gamma: int, c: float) -> float:
  """Theorem 3.8: expected speedup over the baseline decoder.

  Args:
    alpha: The acceptance rate, in [0, 1].
    gamma: Tokens drafted per target call, >= 0.
    c: Time of a draft step / time of a target step, >= 0.

  Returns:
    (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)).
  """
  if not c >= 0:
    raise ValueError(f"c must be >= 0, got {c}.")
  return expected_tokens_per_call(alpha, gamma) / (gamma * c + 1)


def call_cost_speedup(
    tokens_per_call: float,
    gamma: int,
    target_step: float,
    target_verify: float,
    draft_step: float,
) -> float:
  """Theorem 3.8 with the measured (gamma+1)-token call in place of a step.

  Theorem 3.8 assumes that the target scores gamma + 1 tokens in the time of
  one step, which holds where a step is bound by memory, not arithmetic.
  This is the speedup that the measured call costs allow a loop that adds
  no time of its own.

  Args:
    tokens_per_call: Tokens per target call, measured or expected, > 0.
    gamma: Tokens drafted per target call, >= 0.
    target_step: Time of a 1-token target call, > 0.
    target_verify: Time of a (gamma+1)-token target call, > 0.
    draft_step: Time of a 1-token draft call, >= 0.

  Returns:
    tokens_per_call * target_step / (gamma * draft_step + target_verify).
  """
  for name, value in (
      ("tokens_per_call", tokens_per_call),
      ("target_step", target_step),
      ("target_verify", target_verify),
  ):
    if not value > 0:
      raise ValueError(f"{name} must be > 0, got {value}.")
  if not draft_step >= 0:
    raise ValueError(f"draft_step must be >= 0, got {draft_step}.")
  return tokens_per_call * target_step / (gamma * draft_step + target_verify)


def optimal_gamma(alpha: float, c: float, max_gamma: int = _MAX_GAMMA) -> int:
  """The gamma in 1..max_gamma that maximizes Theorem 3.8's improvement.

  Speculation pays at all (improvement > 1 at the returned gamma) exactly when
  alpha > c (Corollary 3.9).

  Args:
    alpha: The acceptance rate, in [0, 1].
    c: Time of a draft step / time of a target step, >= 0.
    max_gamma: Largest gamma to consider, >= 1.

  Returns:
    The maximizing gamma; the smallest one on ties.
  """
  if not checks.is_int(max_gamma) or max_gamma < 1:
    raise ValueError(f"max_gamma must be an int >= 1, got {max_gamma!r}.")
  improvements = [
      walltime_improvement(alpha, gamma, c) for gamma in range(1, max_gamma + 1)
  ]
  return int(np.argmax(improvements)) + 1


def operations_factor(alpha: float, gamma: int, c_hat: float) -> float:
  """Theorem 3.11: expected factor of increase in arithmetic operations.

  Args:
    alpha: The acceptance rate, in [0, 1].
    gamma: Tokens drafted per target call, >= 0.
    c_hat: Arithmetic operations per token of the draft / of the target, >= 0.

  Returns:
    (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)).
  """
  if not c_hat >= 0:
    raise ValueError(f"c_hat must be >= 0, got {c_hat}.")
  return (gamma * c_hat + gamma + 1) / expected_tokens_per_call(alpha, gamma)
