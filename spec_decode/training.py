"""Teacher-forced training of T5: the loss, the train step, the eval step.

The loss is token-level cross-entropy over the non-padding targets, plus
t5x's auxiliary z-loss (z_loss * log(Z)^2, which keeps the softmax
normalizer near 1). Optimizers and schedules are in `optimizers.py`; the loop
that runs these steps over a seqio task, with checkpoints and resume, in
`train_loop.py`.
"""

from typing import Any

from flax import struct
import jax
import jax.numpy as jnp
import optax

from spec_decode import distillation
from spec_decode.models import t5

# t5x's default z-loss weight.
Z_LOSS = 1e-4
# The model's batch features, all int32 [B, S] or [B, T].
FEATURES = (
    "encoder_input_tokens",
    "decoder_input_tokens",
    "decoder_target_tokens",
    "decoder_loss_weights",
)


@struct.dataclass
class TrainState:
  """What a checkpoint holds.

  Attributes:
    step: int32 [], optimizer updates applied so far.
    params: the model's parameter tree (float32).
    opt_state: the optax state of `params`.
  """

  step: jax.Array
  params: Any
  opt_state: Any


def init_state(config, optimizer, rng, params=None):
  """A fresh optimizer state at step 0, of `params` or random ones."""
  if params is None:
    params = t5.init_params(config, rng)
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=optimizer.init(params),
  )


def cross_entropy(logits, targets, weights, z_loss=0.0):
  """Summed token cross-entropy, with t5x's z-loss.

  Args:
    logits: float32 [B, T, V].
    targets: int32 [B, T], the token each position predicts.
    weights: [B, T], 1 at real targets and 0 at padding.
    z_loss: the weight of log(Z)^2, Z the softmax's normalizer.

  Returns:
    (loss, z_term, correct): float32 [] sums over the weighted positions of
    the cross-entropy plus z-loss, of the z-loss alone, and of argmax hits.
  """
  weights = weights.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)  # [B, T]
  target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[
      ..., 0
  ]  # [B, T]
  z_term = z_loss * jnp.square(log_z)
  loss = jnp.sum((log_z - target_logits + z_term) * weights)
  correct = jnp.sum((jnp.argmax(logits, axis=-1) == targets) * weights)
  return loss, jnp.sum(z_term * weights), correct


def _logits(model, params, batch, dropout_rng=None, target_encoded=None):
  rngs = None if dropout_rng is None else {"dropout": dropout_rng}
  return model.apply(
      {"params": params},
      batch["encoder_input_tokens"],
      batch["decoder_input_tokens"],
      enable_dropout=dropout_rng is not None,
      target_encoded=target_encoded,
      rngs=rngs,
  )


def _frozen_teacher(teacher, teacher_params, batch, with_logits):
  """The frozen teacher's encoding [B, S, E] and, if `with_logits`, its
  teacher-forced logits [B, T, V] from that one encoding (else None); both
  None without a teacher."""
  if teacher is None:
    return None, None
  encoded = teacher.apply(
      {"params": teacher_params},
      batch["encoder_input_tokens"],
      method=t5.Transformer.encode,
  )
  logits = None
  if with_logits:
    logits = teacher.apply(
        {"params": teacher_params},
        encoded,
        batch["encoder_input_tokens"],
        batch["decoder_input_tokens"],
        method=t5.Transformer.decode_forced,
    )
  return jax.lax.stop_gradient((encoded, logits))


def _shared_encoding(model, teacher_encoded):
  """What `model` reads as its target's encoding: the teacher's for a
  shared-encoder model, None for a model with an encoder of its own."""
  return teacher_encoded if model.config.shared_encoder_dim else None


def train_step(
    state,
    batch,
    teacher_params=None,
    *,
    model,
    optimizer,
    dropout_seed,
    z_loss,
    teacher=None,
    distill=None,
):
  """One optimizer update on a batch.

  Args:
    state: a TrainState.
    batch: the `batching.batches` features, int32 [B, S] and [B, T].
    teacher_params: the teacher's parameters when distilling, else None.
    model: a t5.Transformer.
    optimizer: an optax.GradientTransformation.
    dropout_seed: int; the step's dropout key is fold_in(key(seed), step).
    z_loss: see `cross_entropy`.
    teacher: the teacher's t5.Transformer when distilling or when `model` is
      a shared-encoder draft (which reads the teacher's encoding, frozen),
      else None.
    distill: a `distillation.Distillation` when distilling, else None: the
      loss is then its divergence from the teacher's distributions (frozen,
      without dropout), plus its cross_entropy_weight times the cross-entropy.

  Returns:
    The updated TrainState, and float32 [] metrics: 'loss' (mean per target
    token, z-loss included), 'z_loss', 'accuracy' (of the argmax) and
    'grad_norm' (before clipping); when distilling also 'divergence' (mean
    per target token).
  """
  dropout_rng = jax.random.fold_in(jax.random.key(dropout_seed), state.step)
  weights = batch["decoder_loss_weights"]
  num_tokens = jnp.maximum(jnp.sum(weights), 1).astype(jnp.float32)
  teacher_encoded, teacher_logits = _frozen_teacher(
      teacher, teacher_params, batch, with_logits=distill is not None
  )
  target_encoded = _shared_encoding(model, teacher_encoded)

  def loss_fn(params):
    logits = _logits(model, params, batch, dropout_rng, target_encoded)
    loss, z_term, correct = cross_entropy(
        logits, batch["decoder_target_tokens"], weights, z_loss
    )
    aux = {"z_loss": z_term, "correct": correct}
    if distill is not None:
      aux["divergence"] = distillation.divergence(
          logits,
          teacher_logits,
          weights,
          distill.divergence,
          distill.temperature,
      )
      loss = (
          distill.cross_entropy_weight * (loss - z_term)
          + z_term
          + aux["divergence"]
      )
    return loss / num_tokens, aux

  (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  state = state.replace(
      step=state.step + 1,
      params=optax.apply_updates(state.params, updates),
      opt_state=opt_state,
  )
  metrics = {
      "loss": loss,
      "z_loss": aux["z_loss"] / num_tokens,
      "accuracy": aux["correct"] / num_tokens,
      "grad_norm": optax.tree.norm(grads),
  }
  if distill is not None:
    metrics["divergence"] = aux["divergence"] / num_tokens
  return state, metrics


def eval_step(params, batch, teacher_params=None, *, model, teacher=None):
  """Sums over a batch without dropout: float32 [] loss, tokens, correct.

  With a teacher (and its params), also the sums of each of
  `distillation.DIVERGENCES` from its distributions at temperature 1.
  """
  weights = batch["decoder_loss_weights"]
  teacher_encoded, teacher_logits = _frozen_teacher(
      teacher, teacher_params, batch, with_logits=True
  )
  logits = _logits(
      model,
      params,
      batch,
      target_encoded=_shared_encoding(model, teacher_encoded),
  )
  loss, _, correct = cross_entropy(
      logits, batch["decoder_target_tokens"], weights
  )
  sums = {
      "loss": loss,
      "tokens": jnp.sum(weights).astype(jnp.float32),
      "correct": correct,
  }
  if teacher is not None:
    for kind in distillation.DIVERGENCES:
      sums[kind] = distillation.divergence(
          logits, teacher_logits, weights, kind
      )
  return sums
