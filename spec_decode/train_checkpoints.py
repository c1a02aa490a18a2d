"""Orbax checkpoints of training, laid out as T5X lays out its own.

`model_dir/checkpoint_<step>/state/` holds one Orbax PyTree,

  {'target': params, 'state': {'step': int32 [], 'optimizer': opt_state}},

T5X's names, so `checkpoints.load_params(model_dir/checkpoint_<step>)` reads
the parameters of any training checkpoint. `export_params` writes the
parameters alone (`{'target': params}`), optionally in bfloat16, for
shipping.
"""

import os

from flax import traverse_util
import jax
import orbax.checkpoint as ocp

from spec_decode.checkpoints import checksums

# The item of each step directory, T5X's name for it.
ITEM = "state"
# Step directories are `checkpoint_<step>`, as in T5X.
STEP_PREFIX = "checkpoint"


def manager(model_dir, max_to_keep=2):
  """An Orbax CheckpointManager of `model_dir` (created if missing).

  Saves are synchronous: the train step donates the state's buffers, which a
  background write could still be reading. A demo-sized state takes about a
  second to write.

  Args:
    model_dir: the training directory.
    max_to_keep: the most recent checkpoints kept; older ones are deleted.

  Returns:
    An ocp.CheckpointManager; `close()` it when done.
  """
  return ocp.CheckpointManager(
      os.path.abspath(model_dir),
      options=ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep,
          step_prefix=STEP_PREFIX,
          enable_async_checkpointing=False,
      ),
      item_names=(ITEM,),
  )


def _tree(state):
  return {
      "target": state.params,
      "state": {"step": state.step, "optimizer": state.opt_state},
  }


def save(checkpoint_manager, state):
  """Saves a TrainState at its step."""
  checkpoint_manager.save(
      int(state.step),
      args=ocp.args.Composite(**{ITEM: ocp.args.StandardSave(_tree(state))}),
  )


def restore_latest(checkpoint_manager, state0):
  """The latest checkpoint's TrainState, or `state0` if there is none.

  Args:
    checkpoint_manager: from `manager`.
    state0: a TrainState of the run's structure (a fresh init); its arrays
      give the restored ones' shapes and dtypes.

  Returns:
    A TrainState.
  """
  step = checkpoint_manager.latest_step()
  if step is None:
    return state0
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _tree(state0))
  tree = checkpoint_manager.restore(
      step,
      args=ocp.args.Composite(**{ITEM: ocp.args.StandardRestore(abstract)}),
  )[ITEM]
  return state0.replace(
      step=tree["state"]["step"],
      params=tree["target"],
      opt_state=tree["state"]["optimizer"],
  )


def latest_checkpoint(model_dir):
  """The latest `checkpoint_<step>` directory of `model_dir`, or None.

  Pass it to `checkpoints.load_params` to read its parameters.
  """
  reader = ocp.CheckpointManager(
      os.path.abspath(model_dir),
      options=ocp.CheckpointManagerOptions(
          step_prefix=STEP_PREFIX, read_only=True, create=False
      ),
      item_names=(ITEM,),
  )
  step = reader.latest_step()
  reader.close()
  if step is None:
    return None
  return os.path.join(model_dir, f"{STEP_PREFIX}_{step}")


def export_params(params, directory, dtype=None):
  """Writes the parameters alone, for `checkpoints.load_params`.

  Args:
    params: the model's parameter tree.
    directory: a new directory (it must not exist).
    dtype: cast every parameter to this dtype (e.g. jnp.bfloat16, half the
      size); None keeps each one's dtype.

  Beside Orbax's files it writes `checksums.json`, which
  `checkpoints.load_params` verifies.
  """
  if dtype is not None:
    params = jax.tree.map(lambda x: x.astype(dtype), params)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.path.abspath(directory), {"target": params})
  checksums.write(
      directory,
      jax.device_get(traverse_util.flatten_dict(params, sep="/")),
  )
