"""A run's models: each config under its gin scope, its weights from a checkpoint.

include 'target:models/t5_1_1_xxl.gin'
target/checkpoint_path.path = 'gs://.../t5_1_1_xxl/checkpoint_1000000'
"""

import dataclasses
from typing import Any

import gin
import jax

from spec_decode import checkpoints
from spec_decode import partitioning
from spec_decode.models import t5


@gin.configurable
def checkpoint_path(path=gin.REQUIRED):
  """The checkpoint of the model in scope (bind it as target/ or draft/)."""
  return path


@dataclasses.dataclass(frozen=True)
class LoadedModel:
  """A T5 and its parameters.

  Attributes:
    name: the gin scope it was configured under ('target' or 'draft').
    config: its T5Config.
    model: the Transformer module.
    params: its parameter tree, on the default device.
  """

  name: str
  config: t5.T5Config
  model: t5.Transformer
  params: Any


def model_config(scope):
  """The T5Config bound under `scope`."""
  with gin.config_scope(scope):
    return t5.T5Config()


def load_model(scope, mesh=None, rules=partitioning.LOGICAL_AXIS_RULES):
  """Builds the model configured under `scope` and loads its checkpoint.

  Args:
    scope: 'target' or 'draft'.
    mesh: a device mesh to shard the parameters over as they are read (each
      host reads only its devices' slices); None puts them on the default
      device.
    rules: the logical-axis rules that shard them.

  Returns:
    A LoadedModel.

  Raises:
    ValueError: the checkpoint is missing or does not fit the config (the
      message names the model).
  """
  config = model_config(scope)
  with gin.config_scope(scope):
    path = checkpoint_path()
  shapes = t5.param_shapes(config)
  try:
    shardings = None
    if mesh is not None:
      shardings = partitioning.shardings(
          shapes, t5.param_logical_axes(config), mesh, rules
      )
    params = checkpoints.load_params(
        path, shapes, dtype=config.activation_dtype, shardings=shardings
    )
  except checkpoints.CheckpointError as e:
    # The same class, so that a list of mismatches is still shown whole.
    raise type(e)(f"{scope} checkpoint: {e}") from e
  except ValueError as e:
    raise ValueError(f"{scope} parameter {e}") from e
  if mesh is None:
    params = jax.device_put(params)
  return LoadedModel(scope, config, t5.Transformer(config), params)


def check_same_vocab(target_config, draft_config):
  """Raises ValueError unless the two models share a vocabulary size."""
  if target_config.vocab_size != draft_config.vocab_size:
    raise ValueError(
        f"the draft's vocab_size ({draft_config.vocab_size}) differs from the "
        f"target's ({target_config.vocab_size}): speculative decoding needs "
        "one vocabulary"
    )
