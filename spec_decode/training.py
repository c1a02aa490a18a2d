"""Teacher-forced training of T5 on a seqio task: loss, steps, loop.

The loss is token-level cross-entropy over the non-padding targets, plus
t5x's auxiliary z-loss (z_loss * log(Z)^2, which keeps the softmax
normalizer near 1). Optimizers and schedules are in `optimizers.py`;
checkpoints of params, optimizer state and step in `train_checkpoints.py`.

`train` is the whole loop: batches of a seqio task (`batching.batches`), a
jitted train step with dropout keys from `fold_in(seed, step)`, a tqdm bar
with the running loss, eval loss on a held-out split every `eval_every`
steps, Orbax checkpoints every `checkpoint_every` steps and resume from the
latest, metrics as JSON lines and the operative gin config in `model_dir`.

Usage (a notebook):
  gin_config.parse(["train/multi30k_target.gin"])
  state = training.train(T5Config())
"""

import functools
import json
import os
import time
from typing import Any

from flax import struct
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

from spec_decode import batching
from spec_decode import distillation
from spec_decode import growth
from spec_decode import pair

# Registers the optimizers and schedules that train.optimizer names in gin.
from spec_decode import optimizers  # pylint: disable=unused-import
from spec_decode import train_checkpoints
from spec_decode.models import t5

# t5x's default z-loss weight.
Z_LOSS = 1e-4
# The model's batch features, all int32 [B, S] or [B, T].
_FEATURES = (
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


def _pad_batch(batch, batch_size):
  """Pads a last, short batch with all-padding rows, so one shape compiles."""
  rows = batch_size - len(batch["encoder_input_tokens"])
  return {k: np.pad(batch[k], ((0, rows), (0, 0))) for k in _FEATURES}


def evaluate(eval_fn, params, batches, batch_size):
  """Mean per-token loss, accuracy and divergences over every batch.

  Args:
    eval_fn: the jitted `eval_step`, (params, batch) -> sums.
    params: the model's parameters.
    batches: an iterable of `batching.batches` dicts of at most `batch_size`
      rows.
    batch_size: B; shorter batches are padded to it.

  Returns:
    {'loss': float, 'accuracy': float, 'tokens': int}, no z-loss, and the
    mean of each divergence `eval_fn` sums.
  """
  totals = None
  for batch in batches:
    sums = eval_fn(params, _pad_batch(batch, batch_size))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  totals = jax.device_get(totals)
  tokens = max(float(totals["tokens"]), 1.0)
  means = {k: float(v) / tokens for k, v in totals.items() if k != "correct"}
  means["accuracy"] = float(totals["correct"]) / tokens
  means["tokens"] = int(totals["tokens"])
  return means


def _append_metrics(path, record):
  with open(path, "a") as f:
    f.write(json.dumps(record) + "\n")


def _means(metrics):
  """Per-key means of a list of dicts of float32 [] device arrays."""
  stacked = jax.tree.map(lambda *x: jnp.stack(x), *metrics)
  return {k: float(np.mean(v)) for k, v in jax.device_get(stacked).items()}


def _step_functions(model, optimizer, seed, z_loss, distill):
  """The jitted train step, (state, batch), and eval step, (params, batch).

  When distilling, or when `model` is a shared-encoder draft, the teacher
  configured under the gin scope 'teacher' is loaded here; its params are
  passed to both steps as arguments, not traced in as constants.
  """
  teacher_model, teacher_params = None, None
  if distill is not None or model.config.shared_encoder_dim:
    teacher = pair.load_model("teacher")
    pair.check_pair(teacher.config, model.config)
    teacher_model, teacher_params = teacher.model, teacher.params
  train_jit = jax.jit(
      functools.partial(
          train_step,
          model=model,
          optimizer=optimizer,
          dropout_seed=seed,
          z_loss=z_loss,
          teacher=teacher_model,
          distill=distill,
      ),
      donate_argnums=0,
  )
  eval_jit = jax.jit(
      functools.partial(eval_step, model=model, teacher=teacher_model)
  )
  return (
      lambda state, batch: train_jit(state, batch, teacher_params),
      lambda params, batch: eval_jit(params, batch, teacher_params),
  )


@gin.configurable(denylist=["model_config"])
def train(
    model_config,
    model_dir=gin.REQUIRED,
    task=gin.REQUIRED,
    num_steps=gin.REQUIRED,
    batch_size=gin.REQUIRED,
    feature_lengths=gin.REQUIRED,
    optimizer=gin.REQUIRED,
    length_buckets=(),
    eval_task=None,
    eval_split="validation",
    eval_every=500,
    checkpoint_every=1000,
    keep_checkpoints=2,
    log_every=10,
    z_loss=Z_LOSS,
    seed=0,
    export_dir=None,
    export_dtype="float32",
    init_from=None,
    init_from_config=None,
    distill=None,
):
  """Trains (or resumes training) a T5 on a seqio task.

  Args:
    model_config: the model's T5Config; its dropout_rate applies here.
    model_dir: checkpoints (`checkpoint_<step>/`), `metrics.jsonl` and the
      operative `config.gin` go here; training resumes from its latest
      checkpoint.
    task: the training seqio task's name ('train' split).
    num_steps: train until this step.
    batch_size: B, examples per step.
    feature_lengths: {'inputs': S, 'targets': T}, padded (and cut) lengths.
    optimizer: an optax.GradientTransformation (`optimizers.adamw()`, ...).
    length_buckets: training batches' (S_i, T_i) length buckets, see
      `batching.batches`; evaluation pads every batch to (S, T).
    eval_task: the task to evaluate; None means `task`.
    eval_split: its split; None disables evaluation.
    eval_every: evaluate every this many steps, and at the end.
    checkpoint_every: save every this many steps, and at the end.
    keep_checkpoints: the most recent checkpoints to keep.
    log_every: steps between updates of the progress bar and metrics file.
    z_loss: see `cross_entropy`.
    seed: seeds the init, the dropout keys and the data order.
    export_dir: if set, the final params are also written here alone, in a
      form `checkpoints.load_params` reads.
    export_dtype: 'float32' or 'bfloat16' for the exported params.
    init_from: a trained checkpoint of a smaller T5 to start from, grown into
      `model_config` by `growth.grown_params` (same logits, then trained);
      None starts from random weights. Ignored when resuming.
    init_from_config: the T5Config of `init_from`'s model.
    distill: a `distillation.Distillation` to train on the distributions of
      the teacher (the model under the gin scope 'teacher'), see
      `distillation.py`; None trains on the batches' tokens alone. A
      shared-encoder `model_config` (shared_encoder_dim > 0) reads that
      teacher's encoder output, frozen, with or without `distill`.

  Returns:
    The final TrainState.
  """
  model = t5.Transformer(model_config)
  os.makedirs(model_dir, exist_ok=True)
  manager = train_checkpoints.manager(model_dir, keep_checkpoints)
  rng = jax.random.key(seed)
  params = None
  if init_from and manager.latest_step() is None:
    params = growth.grown_params(init_from, init_from_config, model_config, rng)
  state = train_checkpoints.restore_latest(
      manager, init_state(model_config, optimizer, rng, params)
  )
  start_step = int(state.step)
  step_fn, eval_fn = _step_functions(model, optimizer, seed, z_loss, distill)
  # A resumed run reshuffles with a seed of its own, rather than replaying
  # the batches already seen.
  train_batches = batching.batches(
      task,
      "train",
      batch_size,
      feature_lengths=feature_lengths,
      shuffle=True,
      seed=seed + start_step,
      num_epochs=None,
      drop_remainder=True,
      length_buckets=length_buckets,
  )
  metrics_file = os.path.join(model_dir, "metrics.jsonl")
  with open(os.path.join(model_dir, "config.gin"), "w") as f:
    f.write(gin.operative_config_str())
  pending, last_time = [], time.perf_counter()
  with tqdm.tqdm(
      total=num_steps, initial=start_step, desc="train", dynamic_ncols=True
  ) as bar:
    for step in range(start_step + 1, num_steps + 1):
      batch = {k: v for k, v in next(train_batches).items() if k in _FEATURES}
      state, metrics = step_fn(state, batch)
      pending.append(metrics)
      if step % log_every == 0 or step == num_steps:
        means = _means(pending)
        now = time.perf_counter()
        means["seconds_per_step"] = (now - last_time) / len(pending)
        _append_metrics(metrics_file, {"step": step, **means})
        bar.set_postfix(loss=f"{means['loss']:.3f}")
        bar.update(len(pending))
        pending, last_time = [], now
      if eval_split and (step % eval_every == 0 or step == num_steps):
        result = evaluate(
            eval_fn,
            state.params,
            batching.batches(
                eval_task or task,
                eval_split,
                batch_size,
                feature_lengths=feature_lengths,
            ),
            batch_size,
        )
        _append_metrics(
            metrics_file,
            {"step": step, **{f"eval_{k}": v for k, v in result.items()}},
        )
        bar.write(
            f"step {step}: eval loss {result['loss']:.4f}, "
            f"accuracy {result['accuracy']:.4f}"
        )
      if step % checkpoint_every == 0 or step == num_steps:
        train_checkpoints.save(manager, state)
  manager.close()
  if export_dir:
    train_checkpoints.export_params(
        state.params, export_dir, jnp.dtype(export_dtype)
    )
  return state
