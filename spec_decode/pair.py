"""A run's models: each config under its gin scope, its weights from a checkpoint.

  include 'target:models/t5_1_1_xxl.gin'
  target/checkpoint_path.path = 'gs://.../t5_1_1_xxl/checkpoint_1000000'

A Hugging Face checkpoint directory needs no size file: its `config.json`
gives the T5Config (`checkpoints.hf_config`),

  target/checkpoint_path.path = '~/models/flan-t5-xl'

and a size file included as well is checked against it: a field it binds to
another value is an error naming each such field, never silently preferred.
Gin still sets what config.json does not hold (dtype, dropout_rate).
"""

import dataclasses
import os
from typing import Any

import gin
import jax

from spec_decode import checkpoints
from spec_decode import huge_pages
from spec_decode import partitioning
from spec_decode.checkpoints import hf_config
from spec_decode.checkpoints import storage
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


def bound_checkpoint_path(scope):
  """The checkpoint path bound under `scope`, expanded; None if unbound."""
  with gin.config_scope(scope):
    path = gin.get_bindings(checkpoint_path).get("path")
  return None if path is None else storage.expand(path)


def model_config(scope):
  """The T5Config of the model under `scope`.

  From its checkpoint's config.json when it has one (checked against the
  T5Config fields gin binds under `scope`), else from gin alone. A dtype of
  'auto' becomes the checkpoint's stored one.

  Args:
    scope: 'target' or 'draft'.

  Returns:
    The T5Config.

  Raises:
    ValueError: config.json and gin disagree (one line naming each differing
      field), or config.json is not a T5 this code runs, or 'auto' cannot be
      resolved.
  """
  try:
    path = bound_checkpoint_path(scope)
    config_file = _hf_config_file(path)
    with gin.config_scope(scope):
      if config_file is None:
        config = t5.T5Config()
      else:
        config = t5.T5Config(**_checked_fields(config_file, scope))
    if config.dtype == "auto" and path is None:
      raise ValueError(
          f"{scope}/T5Config.dtype 'auto' takes the checkpoint's dtype, and "
          f"{scope}/checkpoint_path.path is not set"
      )
    if config.dtype == "auto":
      config = dataclasses.replace(config, dtype=checkpoints.stored_dtype(path))
  except checkpoints.CheckpointError as e:
    raise ValueError(f"{scope} checkpoint: {e}") from e
  return config


def _hf_config_file(path):
  """The config.json of a local Hugging Face checkpoint; else None."""
  if path is None or storage.is_gcs(path) or not os.path.exists(path):
    return None
  if checkpoints.detect_format(path) is not checkpoints.Format.HUGGING_FACE:
    return None
  return hf_config.find(path)


def _checked_fields(config_file, scope):
  """config.json's T5Config fields, once gin's bindings agree with them."""
  fields = hf_config.t5_fields(hf_config.read(config_file), config_file)
  with gin.config_scope(scope):
    bound = gin.get_bindings(t5.T5Config)
  differing = [
      f"{name} {_plain(bound[name])!r} (gin) != {value!r}"
      for name, value in fields.items()
      if name in bound and _plain(bound[name]) != value
  ]
  if differing:
    raise ValueError(
        f"{scope}: the gin config differs from {config_file}: "
        f"{'; '.join(differing)} (drop the size file, or fix it)"
    )
  return fields


def _plain(value):
  """A gin-bound value as config.json's fields hold it (lists as tuples)."""
  return tuple(value) if isinstance(value, list) else value


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
  # Checkpoints hold t5x's layout; a transposed_kernels model gets its
  # kernels transposed once loaded.
  stored = dataclasses.replace(
      config, transposed_kernels=False, few_rows_kernel=False
  )
  shapes = t5.param_shapes(stored)
  try:
    shardings = None
    if mesh is not None:
      shardings = partitioning.shardings(
          shapes, t5.param_logical_axes(stored), mesh, rules
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
  if config.transposed_kernels:
    params = _transposed(params, config, mesh, rules)
  params = huge_pages.collapse(params)
  return LoadedModel(scope, config, t5.Transformer(config), params)


def _transposed(params, config, mesh, rules):
  """t5.transpose_kernels on device, sharded as `config`'s axes say."""
  if mesh is None:
    return jax.jit(t5.transpose_kernels)(params)
  shardings = partitioning.shardings(
      t5.param_shapes(config), t5.param_logical_axes(config), mesh, rules
  )
  return jax.jit(t5.transpose_kernels, out_shardings=shardings)(params)


def check_pair(target_config, draft_config):
  """Raises ValueError unless a draft can run with this target.

  They must share a vocabulary size, and a shared-encoder draft must read
  an encoding of the target's width.
  """
  if target_config.vocab_size != draft_config.vocab_size:
    raise ValueError(
        f"the draft's vocab_size ({draft_config.vocab_size}) differs from the "
        f"target's ({target_config.vocab_size}): speculative decoding needs "
        "one vocabulary"
    )
  if target_config.shared_encoder_dim:
    raise ValueError(
        "the target is a shared-encoder draft (shared_encoder_dim "
        f"{target_config.shared_encoder_dim}): a target needs an encoder"
    )
  shared = draft_config.shared_encoder_dim
  if shared and shared != target_config.emb_dim:
    raise ValueError(
        f"the draft's shared_encoder_dim ({shared}) differs from the "
        f"target's emb_dim ({target_config.emb_dim}): a shared-encoder draft "
        "reads the target's encoder output"
    )
