"""The device mesh and the one table of logical-axis sharding rules.

Parameters, caches and loop state name their axes logically (t5x's names:
'batch', 'embed', 'heads', ...); `LOGICAL_AXIS_RULES` maps each name to a mesh
axis or to None (replicated). The mesh has a 'data' axis (rows of the batch)
and a 'model' axis (the model's wide dimensions), as in t5x with 1-D model
parallelism.

Usage:

  mesh = partitioning.make_mesh(model_parallel=4)
  with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.rules()):
    ...  # flax's logical constraints apply here, and only here.

(Under the deprecated `with mesh:`, flax's logical constraints silently do
nothing in JAX 0.10.)
"""

import contextlib

from flax import linen as nn
import gin
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

from spec_decode import checks

MESH_AXES = ("data", "model")

# t5x's standard rules (`standard_logical_axis_rules` with 1-D model
# parallelism), and the caches' and loop states' own axes.
LOGICAL_AXIS_RULES = (
    # Parameters and activations.
    ("batch", "data"),
    ("vocab", "model"),
    ("mlp", "model"),
    ("heads", "model"),
    ("joined_kv", "model"),
    ("embed", None),
    # A shared-encoder draft's projection reads the target's encoder width.
    ("encoder_embed", None),
    ("kv", None),
    ("length", None),
    ("relpos_buckets", None),
    # Decode caches: keys [batch, heads, kv, sequence], values [batch, heads,
    # sequence, kv].
    ("cache_batch", "data"),
    ("cache_sequence", None),
    ("cache_heads", "model"),
    ("cache_kv", None),
)


def rules(replicate_model=False):
  """The rules; with `replicate_model`, nothing is split over 'model'.

  Args:
    replicate_model: keep every model dimension whole on each device, e.g.
      for a small draft that would only pay for communication if split.

  Returns:
    ((logical name, mesh axis or None), ...).
  """
  if not replicate_model:
    return LOGICAL_AXIS_RULES
  return tuple(
      (name, None if axis == "model" else axis)
      for name, axis in LOGICAL_AXIS_RULES
  )


@gin.configurable
def make_mesh(model_parallel=1, num_devices=None):
  """A ('data', 'model') mesh, `model_parallel` wide.

  Args:
    model_parallel: the 'model' axis size; the 'data' axis takes the rest.
    num_devices: use the first this many devices (of every host); None for
      all of them. 1 runs on one device.

  Returns:
    A jax.sharding.Mesh whose axes are Auto (so that GSPMD propagates
    shardings and flax's logical constraints apply).

  Raises:
    ValueError: model_parallel does not divide the device count.
  """
  devices = jax.devices()
  if num_devices is not None:
    if not checks.is_int(num_devices) or not 1 <= num_devices <= len(devices):
      raise ValueError(
          f"make_mesh.num_devices must be an int in [1, {len(devices)}], got "
          f"{num_devices!r}"
      )
    devices = devices[:num_devices]
  if (
      not checks.is_int(model_parallel)
      or model_parallel < 1
      or len(devices) % model_parallel
  ):
    raise ValueError(
        f"make_mesh.model_parallel must be a positive divisor of the device "
        f"count {len(devices)}, got {model_parallel!r}"
    )
  shape = (len(devices) // model_parallel, model_parallel)
  return jax.make_mesh(
      shape,
      MESH_AXES,
      axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES),
      devices=devices,
  )


@contextlib.contextmanager
def active(mesh, logical_rules=LOGICAL_AXIS_RULES):
  """Sets the mesh and the rules for tracing (see the module docstring)."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(logical_rules):
    yield


def mesh_spec(logical_spec, logical_rules=LOGICAL_AXIS_RULES):
  """A PartitionSpec of logical names -> one of mesh axes."""
  return nn.logical_to_mesh_axes(tuple(logical_spec), logical_rules)


def shardings(shapes, logical_specs, mesh, logical_rules=LOGICAL_AXIS_RULES):
  """NamedShardings for a tree of arrays, checking that they divide evenly.

  Args:
    shapes: a tree of arrays or jax.ShapeDtypeStruct.
    logical_specs: the same tree with a PartitionSpec of logical names per
      leaf (a prefix tree is fine where a whole subtree shares one spec).
    mesh: the mesh.
    logical_rules: logical name -> mesh axis.

  Returns:
    The tree of NamedShardings.

  Raises:
    ValueError: an axis is not divisible by the mesh axes it is split over;
      the message names the leaf.
  """
  specs = jax.tree.broadcast(
      logical_specs, shapes, is_leaf=lambda x: isinstance(x, PartitionSpec)
  )

  def one(path, shape, spec):
    spec = mesh_spec(spec, logical_rules)
    for size, axes in zip(shape.shape, spec):
      parts = int(np.prod([mesh.shape[a] for a in _axis_names(axes)]))
      if size % parts:
        raise ValueError(
            f"{jax.tree_util.keystr(path, simple=True, separator='/')}: an "
            f"axis of size {size} cannot be split {parts} ways over mesh "
            f"axis {axes!r}; change make_mesh.model_parallel or the batch "
            "size"
        )
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(
      one,
      shapes,
      specs,
      is_leaf=lambda x: isinstance(x, PartitionSpec),
  )


def _axis_names(axes):
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def replicated(mesh):
  """A sharding that puts a whole copy on every device of `mesh`."""
  return NamedSharding(mesh, PartitionSpec())


def place(host_array, sharding):
  """Puts a host array (the same on every host) onto devices, sharded.

  Each host copies only the pieces its own devices hold, so this feeds
  inputs per host on a multi-host mesh.
  """
  host_array = np.asarray(host_array)
  return jax.make_array_from_callback(
      host_array.shape, sharding, lambda index: host_array[index]
  )
