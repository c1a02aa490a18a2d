"""Distilling a draft from its target's distributions (DistillSpec).

Zhou et al., "DistillSpec" (ICLR 2024, arXiv 2310.08461): a draft trained to
match the target's whole next-token distribution p, teacher-forced, rather
than only the target's greedy outputs, is accepted more often when sampling.
The acceptance probability at a position is beta = sum_x min(p(x), q(x)) =
1 - TV(p, q) (Corollary 3.6), so total variation is the divergence that
alpha itself measures; forward KL, sum_x p (log p - log q), is its smooth
upper bound (Pinsker) and trains the way cross-entropy does.

In training (`train_loop.train(distill=Distillation(...))`) the teacher
is the model configured under the gin scope 'teacher' (as a run's target is
under 'target', see `pair.py`):

  include 'teacher:models/demo_target_48m.gin'
  teacher/checkpoint_path.path = 'spec_decode/demo/target_48m'
  train.distillation = @Distillation()
  Distillation.divergence = 'tvd'

Its logits come from a forward pass of the frozen teacher on each batch,
inside the jitted train step; the draft's loss at each target position is the
divergence from the teacher's distribution after `temperature`, plus
`cross_entropy_weight` times the cross-entropy of the batch's own token.
"""

import dataclasses

import gin
import jax
import jax.numpy as jnp

DIVERGENCES = ("forward_kl", "tvd")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Distillation:
  """How a student learns from the teacher.

  Attributes:
    divergence: 'forward_kl' (KL(p || q)) or 'tvd' (total variation, 1 -
      beta).
    temperature: both models' logits are divided by it before the divergence;
      1 matches the distributions sampling sees.
    cross_entropy_weight: the weight of the batch tokens' cross-entropy added
      to the divergence (0: the teacher alone).
  """

  divergence: str = "forward_kl"
  temperature: float = 1.0
  cross_entropy_weight: float = 0.0

  def __post_init__(self):
    if self.divergence not in DIVERGENCES:
      raise ValueError(
          f"Distillation.divergence {self.divergence!r} is not one of "
          f"{', '.join(DIVERGENCES)}"
      )
    if self.temperature <= 0:
      raise ValueError(
          f"Distillation.temperature must be > 0, got {self.temperature}"
      )


def divergence(student_logits, teacher_logits, weights, kind, temperature=1.0):
  """The divergence of q (student) from p (teacher), summed over positions.

  Args:
    student_logits: [B, T, V], the student's q before the softmax.
    teacher_logits: [B, T, V], the teacher's p before the softmax.
    weights: [B, T], 1 at real targets and 0 at padding.
    kind: 'forward_kl' or 'tvd' (see `Distillation`).
    temperature: both logits are divided by it first.

  Returns:
    float32 [], the weighted sum over positions, computed in float32.
  """
  log_q = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature)
  log_p = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature)
  p = jnp.exp(log_p)
  if kind == "forward_kl":
    per_position = jnp.sum(p * (log_p - log_q), axis=-1)  # [B, T]
  elif kind == "tvd":
    per_position = 0.5 * jnp.sum(jnp.abs(p - jnp.exp(log_q)), axis=-1)
  else:
    raise ValueError(f"divergence {kind!r} is not one of {DIVERGENCES}")
  return jnp.sum(per_position * weights.astype(jnp.float32))
