"""The training loop: a T5 trained (or resumed) on a seqio task.

`train` runs the whole loop: batches of a seqio task (`batching.batches`), a
jitted `training.train_step` with dropout keys from `fold_in(seed, step)`, a
tqdm bar with the running loss, eval loss on a held-out split every
`eval_every` steps, Orbax checkpoints (`train_checkpoints.py`) every
`checkpoint_every` steps and resume from the latest (Ctrl-C saves the last
finished step), metrics as JSON lines and the operative gin config in
`model_dir`. Its settings are checked first (`train_checks.py`).

Usage (a notebook):
  gin_config.parse(["train/multi30k_target.gin"])
  state = train_loop.train(T5Config())
"""

import functools
import json
import os
import time

import gin
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from spec_decode import batching
from spec_decode import growth

# Registers the optimizers and schedules that train.optimizer names in gin.
from spec_decode import optimizers  # pylint: disable=unused-import
from spec_decode import pair
from spec_decode import train_checkpoints
from spec_decode import train_checks
from spec_decode import training
from spec_decode.models import t5


def _pad_batch(batch, batch_size):
  """Pads a last, short batch with all-padding rows, so one shape compiles."""
  rows = batch_size - len(batch["encoder_input_tokens"])
  return {k: np.pad(batch[k], ((0, rows), (0, 0))) for k in training.FEATURES}


def evaluate(eval_fn, params, batches, batch_size):
  """Mean per-token loss, accuracy and divergences over every batch.

  Args:
    eval_fn: the jitted `training.eval_step`, (params, batch) -> sums.
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
          training.train_step,
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
      functools.partial(training.eval_step, model=model, teacher=teacher_model)
  )
  return (
      lambda state, batch: train_jit(state, batch, teacher_params),
      lambda params, batch: eval_jit(params, batch, teacher_params),
  )


def _restore_or_init_state(
    manager, model_config, optimizer, seed, init_from, init_from_config
):
  """The latest checkpoint's TrainState in `manager`, else a fresh one.

  A fresh state is seeded by `seed`; it starts from `init_from` grown into
  `model_config` when given, else from random weights.
  """
  rng = jax.random.key(seed)
  params = None
  if init_from and manager.latest_step() is None:
    params = growth.grown_params(init_from, init_from_config, model_config, rng)
  return train_checkpoints.restore_latest(
      manager, training.init_state(model_config, optimizer, rng, params)
  )


def _train_batches(task, batch_size, feature_lengths, length_buckets, seed):
  """An endless iterator of shuffled 'train' batches of `training.FEATURES`."""
  batches = batching.batches(
      task,
      "train",
      batch_size,
      feature_lengths=feature_lengths,
      shuffle=True,
      seed=seed,
      num_epochs=None,
      drop_remainder=True,
      length_buckets=length_buckets,
  )
  return (
      {k: v for k, v in batch.items() if k in training.FEATURES}
      for batch in batches
  )


def _log_train_metrics(metrics_file, step, pending, since, bar):
  """Appends the means of the `pending` step metrics and advances `bar`.

  Returns:
    The time now, from which the next record's seconds_per_step counts.
  """
  means = _means(pending)
  now = time.perf_counter()
  means["seconds_per_step"] = (now - since) / len(pending)
  _append_metrics(metrics_file, {"step": step, **means})
  bar.set_postfix(loss=f"{means['loss']:.3f}")
  bar.update(len(pending))
  return now


def _evaluate_at(
    step,
    eval_fn,
    params,
    task,
    split,
    batch_size,
    feature_lengths,
    metrics_file,
    bar,
):
  """Evaluates `params` on `task`'s `split` and logs it as eval_* at `step`."""
  result = evaluate(
      eval_fn,
      params,
      batching.batches(
          task, split, batch_size, feature_lengths=feature_lengths
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


def _train_steps(
    state,
    step_fn,
    train_batches,
    manager,
    *,
    num_steps,
    log_every,
    checkpoint_every,
    metrics_file,
    evaluate,
    eval_every,
):
  """Steps to num_steps, logging, evaluating and saving on their schedules.

  Returns:
    The TrainState at num_steps.

  Raises:
    KeyboardInterrupt: on Ctrl-C, after saving the last finished step (when
      it was not saved yet), saying where training resumes.
  """
  pending, last_time = [], time.perf_counter()
  with tqdm.tqdm(
      total=num_steps, initial=int(state.step), desc="train", dynamic_ncols=True
  ) as bar:
    try:
      for step in range(int(state.step) + 1, num_steps + 1):
        state, metrics = step_fn(state, next(train_batches))
        pending.append(metrics)
        if step % log_every == 0 or step == num_steps:
          last_time = _log_train_metrics(
              metrics_file, step, pending, last_time, bar
          )
          pending = []
        if eval_every and (step % eval_every == 0 or step == num_steps):
          evaluate(step, params=state.params, bar=bar)
        if step % checkpoint_every == 0 or step == num_steps:
          train_checkpoints.save(manager, state)
    except KeyboardInterrupt:
      raise KeyboardInterrupt(_save_interrupted(manager, state)) from None
  return state


def _save_interrupted(manager, state):
  """Saves the last finished step, unless saved; says where to resume."""
  latest = manager.latest_step()
  if any(leaf.is_deleted() for leaf in jax.tree.leaves(state)):
    # Stopped inside step_fn, after it took (donated) the state's buffers.
    saved = f"checkpoint_{latest}" if latest is not None else "no checkpoint"
    return (
        f"during a step, which was not saved; {manager.directory} has {saved}"
    )
  step = int(state.step)
  if not step:
    return "before the first step; nothing to save"
  if latest != step:
    train_checkpoints.save(manager, state)
  return (
      f"at step {step}, saved as checkpoint_{step} in {manager.directory}: "
      "the same command resumes there"
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
    z_loss=training.Z_LOSS,
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
    z_loss: see `training.cross_entropy`.
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
    The final `training.TrainState`.

  Raises:
    ValueError: on a bad optimizer, count, length, seed, split or export
      setting, before any work.
  """
  train_checks.check_args(
      optimizer,
      seed,
      export_dir,
      export_dtype,
      feature_lengths,
      num_steps=num_steps,
      batch_size=batch_size,
      eval_every=eval_every,
      checkpoint_every=checkpoint_every,
      keep_checkpoints=keep_checkpoints,
      log_every=log_every,
  )
  train_checks.check_splits(task, eval_task, eval_split)
  model = t5.Transformer(model_config)
  os.makedirs(model_dir, exist_ok=True)
  manager = train_checkpoints.manager(model_dir, keep_checkpoints)
  state = _restore_or_init_state(
      manager, model_config, optimizer, seed, init_from, init_from_config
  )
  start_step = int(state.step)
  step_fn, eval_fn = _step_functions(model, optimizer, seed, z_loss, distill)
  # A resumed run reshuffles with a seed of its own, rather than replaying
  # the batches already seen.
  train_batches = _train_batches(
      task, batch_size, feature_lengths, length_buckets, seed + start_step
  )
  metrics_file = os.path.join(model_dir, "metrics.jsonl")
  with open(os.path.join(model_dir, "config.gin"), "w") as f:
    f.write(gin.operative_config_str())
  state = _train_steps(
      state,
      step_fn,
      train_batches,
      manager,
      num_steps=num_steps,
      log_every=log_every,
      checkpoint_every=checkpoint_every,
      metrics_file=metrics_file,
      evaluate=functools.partial(
          _evaluate_at,
          eval_fn=eval_fn,
          task=eval_task or task,
          split=eval_split,
          batch_size=batch_size,
          feature_lengths=feature_lengths,
          metrics_file=metrics_file,
      ),
      eval_every=eval_every if eval_split else None,
  )
  manager.close()
  if export_dir:
    train_checkpoints.export_params(
        state.params, export_dir, jnp.dtype(export_dtype)
    )
  return state
