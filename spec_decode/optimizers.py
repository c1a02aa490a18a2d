"""Optimizers and learning-rate schedules for training, chosen in gin.

  train.optimizer = @adamw()
  adamw.learning_rate = @warmup_cosine()
  warmup_cosine.peak = 1e-3

or T5's recipe, Adafactor with an inverse square root decay (Raffel et al.,
2020, Section 3.1.2; Shazeer and Stern, 2018):

  train.optimizer = @adafactor()
  adafactor.learning_rate = @warmup_rsqrt()

A schedule maps the number of updates applied so far, int32 [], to a float32
[] learning rate.
"""

import gin
import jax
import jax.numpy as jnp
import optax


@gin.configurable
def warmup_rsqrt(peak=gin.REQUIRED, warmup_steps=gin.REQUIRED):
  """Linear warmup to `peak`, then peak * sqrt(warmup_steps / step).

  Args:
    peak: the rate at `warmup_steps` (T5: 0.01 with 10,000 warmup steps).
    warmup_steps: the length of the warmup.

  Returns:
    A schedule.
  """

  def schedule(count):
    step = jnp.maximum(jnp.asarray(count, jnp.float32), 1.0)
    return peak * jnp.minimum(
        step / warmup_steps, jnp.sqrt(warmup_steps / step)
    )

  return schedule


@gin.configurable
def warmup_cosine(
    peak=gin.REQUIRED,
    warmup_steps=gin.REQUIRED,
    total_steps=gin.REQUIRED,
    end_fraction=0.1,
):
  """Linear warmup from 0 to `peak`, then a cosine decay.

  Args:
    peak: the rate at the end of the warmup.
    warmup_steps: the length of the warmup.
    total_steps: the step where the decay ends (the run's length).
    end_fraction: the final rate, as a fraction of `peak`.

  Returns:
    A schedule.
  """
  if not total_steps > warmup_steps:
    raise ValueError(
        f"warmup_cosine.total_steps ({total_steps}, the run's number of "
        f"steps) must exceed warmup_cosine.warmup_steps ({warmup_steps})"
    )
  return optax.warmup_cosine_decay_schedule(
      0.0, peak, warmup_steps, total_steps, end_value=peak * end_fraction
  )


def _matrices(params):
  """True at the parameters that weight decay applies to: not the norms."""
  return jax.tree.map(lambda x: x.ndim > 1, params)


@gin.configurable
def adamw(
    learning_rate=gin.REQUIRED,
    b1=0.9,
    b2=0.98,
    eps=1e-8,
    weight_decay=0.01,
    clip_norm=1.0,
):
  """AdamW after clipping the gradient's global norm.

  Args:
    learning_rate: a float or a schedule.
    b1: the first moment's decay.
    b2: the second moment's decay (0.98 as in Vaswani et al., 2017).
    eps: added to the second moment's root.
    weight_decay: decoupled decay of the matrices (norm scales are exempt).
    clip_norm: the global norm gradients are clipped to.

  Returns:
    An optax.GradientTransformation.
  """
  return optax.chain(
      optax.clip_by_global_norm(clip_norm),
      optax.adamw(
          learning_rate,
          b1=b1,
          b2=b2,
          eps=eps,
          weight_decay=weight_decay,
          mask=_matrices,
      ),
  )


@gin.configurable
def adafactor(
    learning_rate=gin.REQUIRED,
    decay_rate=0.8,
    clipping_threshold=1.0,
    multiply_by_parameter_scale=True,
):
  """Adafactor with T5's settings (factored second moments, no momentum).

  Args:
    learning_rate: a float or a schedule.
    decay_rate: the second moment's decay exponent.
    clipping_threshold: the update clipping of Shazeer and Stern (2018).
    multiply_by_parameter_scale: scale updates by the parameters' RMS.

  Returns:
    An optax.GradientTransformation.
  """
  return optax.adafactor(
      learning_rate,
      decay_rate=decay_rate,
      clipping_threshold=clipping_threshold,
      multiply_by_parameter_scale=multiply_by_parameter_scale,
  )
