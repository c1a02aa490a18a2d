r"""Bytes per device of a target/draft pair on TPU slices, from shapes alone.

  python -m spec_decode.memory_plan \
      [--gin_file=configs/t5_1_1_xxl_small_ende.gin]

Nothing is allocated and no device is needed: parameter shapes come from
`t5.param_shapes`, cache shapes from `jax.eval_shape` of `drafts.t5_cache`,
and each leaf's shard from its logical axes and the rules of
`spec_decode.partitioning` on a mesh given only as its axis sizes. The run
file gives the models, their dtype (parameters are loaded in it), the lengths
and gamma; the caches hold `drafts.speculative_capacity` decoder positions
(max_decode_len + gamma + 1, the room past max_decode_len rounded up to 8s),
as the speculative decoder's do.

Counted: parameters and the two decode caches. Not counted: activations, XLA's
scratch and the loop state, which need a margin of the headroom shown.
"""

import dataclasses
import functools
import inspect
import math

from absl import app
from absl import logging
import gin
import jax
import jax.numpy as jnp

from spec_decode import checks
from spec_decode import cli
from spec_decode import compare
from spec_decode import drafts
from spec_decode import gin_config
from spec_decode import pair
from spec_decode import partitioning
from spec_decode.models import t5

# The run file planned when no --gin_file is given.
_DEFAULT_RUN_FILE = "t5_1_1_xxl_small_ende.gin"

GIB = 2**30
BATCH_SIZES = (1, 8)
DRAFT_OPTIONS = ("replicated", "split")


@dataclasses.dataclass(frozen=True)
class TpuSlice:
  """A TPU slice; each chip is one JAX device.

  Attributes:
    name: e.g. 'v4-8'.
    num_chips: devices in the slice.
    num_hosts: hosts the chips sit on.
    hbm_gib: HBM per chip, GiB.
  """

  name: str
  num_chips: int
  num_hosts: int
  hbm_gib: int


SLICES = (
    TpuSlice("v4-8", num_chips=4, num_hosts=1, hbm_gib=32),
    TpuSlice("v5e-8", num_chips=8, num_hosts=1, hbm_gib=16),
    TpuSlice("v4-32", num_chips=16, num_hosts=4, hbm_gib=32),
)


class NotShardableError(ValueError):
  """A leaf's dimension does not divide over the mesh axes it is split on."""


def _axis_names(axes):
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def leaf_bytes(
    shapes,
    logical_axes,
    mesh_shape,
    logical_rules=partitioning.LOGICAL_AXIS_RULES,
):
  """Each leaf's bytes on one device.

  Args:
    shapes: a tree of jax.ShapeDtypeStruct (or arrays).
    logical_axes: the same tree (or a prefix of it) with a PartitionSpec of
      logical axis names per leaf.
    mesh_shape: {mesh axis: size}, e.g. {'data': 2, 'model': 4}.
    logical_rules: logical name -> mesh axis or None.

  Returns:
    The tree of shapes with an int per leaf: prod(dim / parts) * itemsize,
    where parts is the product of the mesh axes the dimension is split over.

  Raises:
    NotShardableError: a dimension does not divide; the message names the
      leaf.
  """
  specs = jax.tree.broadcast(
      logical_axes,
      shapes,
      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec),
  )

  def one(path, shape, spec):
    mesh_axes = partitioning.mesh_spec(spec, logical_rules)
    dims = list(shape.shape)
    for i, axes in enumerate(mesh_axes):
      parts = math.prod(mesh_shape[a] for a in _axis_names(axes))
      if dims[i] % parts:
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        raise NotShardableError(
            f"{name}: {spec[i]} {dims[i]} over {axes} {parts}"
        )
      dims[i] //= parts
    return math.prod(dims) * jnp.dtype(shape.dtype).itemsize

  return jax.tree_util.tree_map_with_path(
      one,
      shapes,
      specs,
      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec),
  )


def per_device_bytes(
    shapes,
    logical_axes,
    mesh_shape,
    logical_rules=partitioning.LOGICAL_AXIS_RULES,
):
  """The bytes of a tree on one device: the sum of `leaf_bytes`."""
  return sum(
      jax.tree.leaves(
          leaf_bytes(shapes, logical_axes, mesh_shape, logical_rules)
      )
  )


def param_shapes(config):
  """The parameter tree in config.dtype, as the run loads it."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, config.activation_dtype),
      t5.param_shapes(config),
  )


def cache_shapes(config, params, batch_size, max_input_len, capacity):
  """The DecodeCache of ShapeDtypeStructs for int32 inputs [B, max_input_len].

  Args:
    config: the model's T5Config.
    params: its `param_shapes`.
    batch_size: B.
    max_input_len: S.
    capacity: L, the decoder positions.

  Returns:
    The DecodeCache: keys [B, H, D, L] and values [B, H, L, D], cross keys
    [B, H, D, S] and values [B, H, S, D] per decoder layer, in config.dtype;
    encoder_mask bool [B, S]; lengths int32 [B].
  """
  make = functools.partial(
      drafts.empty_cache, t5.Transformer(config), max_length=capacity
  )
  inputs = jax.ShapeDtypeStruct((batch_size, max_input_len), jnp.int32)
  # What `encode` returns (a shared-encoder draft's too): [B, S, emb_dim].
  encoded = jax.ShapeDtypeStruct(
      (batch_size, max_input_len, config.emb_dim),
      jnp.dtype(config.activation_dtype),
  )
  return jax.eval_shape(make, params, encoded, inputs)


def meshes(num_chips, batch_size):
  """The (data, model) meshes a user would try for a batch on a slice.

  All model-parallel, and for a batch > 1 also 2 and `batch_size` rows of
  data parallelism where they divide both the chips and the batch and leave
  'model' at least 2 wide.
  """
  found = [(1, num_chips)]
  for data in (2, batch_size):
    if (
        1 < data <= num_chips // 2
        and not num_chips % data
        and not batch_size % data
        and (data, num_chips // data) not in found
    ):
      found.append((data, num_chips // data))
  return found


@dataclasses.dataclass(frozen=True)
class Row:
  """One configuration's bytes per device.

  Attributes:
    tpu: the slice.
    mesh: (data, model) sizes.
    batch_size: rows per decoder call.
    draft: 'replicated' (whole over 'model') or 'split' (as the rules say).
    target_params, draft_params, target_cache, draft_cache: bytes per device;
      None where `error` is set.
    error: why the configuration is not shardable, or None.
  """

  tpu: TpuSlice
  mesh: tuple[int, int]
  batch_size: int
  draft: str
  target_params: int | None = None
  draft_params: int | None = None
  target_cache: int | None = None
  draft_cache: int | None = None
  error: str | None = None

  @property
  def total(self):
    return (
        self.target_params
        + self.draft_params
        + self.target_cache
        + self.draft_cache
    )


def plan(
    target_config,
    draft_config,
    *,
    max_input_len,
    capacity,
    slices=SLICES,
    batch_sizes=BATCH_SIZES,
):
  """Bytes per device of every slice, mesh, batch size and draft option.

  Args:
    target_config, draft_config: the pair's T5Configs.
    max_input_len: the encoder's length S.
    capacity: the caches' decoder positions (`drafts.speculative_capacity`).
    slices: TpuSlices.
    batch_sizes: batch sizes.

  Returns:
    A list of Rows.
  """
  models = {}
  for which, config in (("target", target_config), ("draft", draft_config)):
    models[which] = (param_shapes(config), t5.param_logical_axes(config))
  caches = {
      (which, batch_size): cache_shapes(
          config, models[which][0], batch_size, max_input_len, capacity
      )
      for which, config in (("target", target_config), ("draft", draft_config))
      for batch_size in batch_sizes
  }
  rows = []
  for tpu in slices:
    for batch_size in batch_sizes:
      for mesh in meshes(tpu.num_chips, batch_size):
        mesh_shape = dict(zip(partitioning.MESH_AXES, mesh))
        for draft in DRAFT_OPTIONS:
          rules = {
              "target": partitioning.rules(),
              "draft": partitioning.rules(
                  replicate_model=draft == "replicated"
              ),
          }
          sizes = {}
          try:
            for which in ("target", "draft"):
              params, axes = models[which]
              cache = caches[which, batch_size]
              sizes[f"{which}_params"] = per_device_bytes(
                  params, axes, mesh_shape, rules[which]
              )
              sizes[f"{which}_cache"] = per_device_bytes(
                  cache, cache.logical_axes(), mesh_shape, rules[which]
              )
          except NotShardableError as e:
            sizes = dict(error=f"{which} {e}")
          rows.append(Row(tpu, mesh, batch_size, draft, **sizes))
  return rows


def _gib(num_bytes):
  return f"{num_bytes / GIB:.2f}"


def format_table(rows):
  """A Markdown table of Rows, GiB per device."""
  lines = [
      "| slice | mesh (data, model) | batch | draft | target params GiB | "
      "draft params GiB | target cache GiB | draft cache GiB | total GiB | "
      "HBM/chip GiB | fits |",
      "|---|---|---|---|--:|--:|--:|--:|--:|--:|---|",
  ]
  for row in rows:
    head = (
        f"| {row.tpu.name} | ({row.mesh[0]}, {row.mesh[1]}) | "
        f"{row.batch_size} | {row.draft} | "
    )
    hbm = f"{row.tpu.hbm_gib}"
    if row.error:
      lines.append(
          head
          + "- | - | - | - | - | "
          + hbm
          + f" | not shardable: {row.error} |"
      )
      continue
    headroom = 100 * (1 - row.total / (row.tpu.hbm_gib * GIB))
    fits = "yes" if headroom >= 0 else "no"
    cells = (
        row.target_params,
        row.draft_params,
        row.target_cache,
        row.draft_cache,
        row.total,
    )
    lines.append(
        head
        + " | ".join(_gib(c) for c in cells)
        + f" | {hbm} | {fits} ({headroom:.0f}% headroom) |"
    )
  return "\n".join(lines)


def _run_setting(name):
  """run.<name> as bound, else its default."""
  try:
    return gin.query_parameter(f"run.{name}")
  except ValueError:
    return inspect.signature(compare.run).parameters[name].default


def table(gin_files, gin_bindings=()):
  """Parses a run's gin files and returns the Markdown table and its notes.

  Configurables this module does not import (seqio's vocabulary) are skipped,
  and required bindings such as run.output_dir are not checked. A run with
  run.gamma = 'auto' is planned at run.max_gamma.

  Raises:
    ValueError: on a missing file, or a length or gamma that is no int >= 1.
    gin_config.GinSyntaxError: on a file or binding that does not parse.
  """
  gin_config.parse(gin_files, gin_bindings, skip_unknown=True, finalize=False)
  target_config = pair.model_config("target")
  draft_config = pair.model_config("draft")
  settings = {
      name: _run_setting(name) for name in ("max_input_len", "max_decode_len")
  }
  # 'auto' chooses at most max_gamma, whose caches are the largest.
  gamma_name = "max_gamma" if _run_setting("gamma") == "auto" else "gamma"
  settings[gamma_name] = _run_setting(gamma_name)
  for name, value in settings.items():
    checks.check_count(value, f"run.{name}")
  max_input_len, max_decode_len, gamma = settings.values()
  capacity = drafts.speculative_capacity(max_decode_len, gamma)
  rows = plan(
      target_config,
      draft_config,
      max_input_len=max_input_len,
      capacity=capacity,
  )
  notes = (
      f"GiB per device. Target: {target_config.num_heads} heads, "
      f"{target_config.dtype}; draft: {draft_config.num_heads} heads, "
      f"{draft_config.dtype}. max_input_len {max_input_len}, cache capacity "
      f"{capacity} (max_decode_len {max_decode_len} + {gamma_name} {gamma} "
      f"+ 1, the room rounded up to {drafts.CAPACITY_STEP}s). "
      "The target is split as the rules say; the draft replicated over "
      "'model' or split. Activations and XLA's scratch are not counted."
  )
  return format_table(rows) + "\n\n" + notes


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # JAX logs backend probing at INFO.
  logging.set_verbosity(logging.WARNING)
  with cli.one_line_errors():
    files = cli.GIN_FILES.value or [_DEFAULT_RUN_FILE]
    print(table(files, cli.GIN_BINDINGS.value))


if __name__ == "__main__":
  cli.run(main)
