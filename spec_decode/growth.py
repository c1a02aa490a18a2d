"""Function-preserving growth of a trained T5 into a wider, deeper one.

Net2Net (Chen, Goodfellow, Shlens, ICLR 2016) for the t5x tree of T5 1.1:
the grown model computes exactly the logits of the model it grew from, and
training goes on from there instead of from random weights.

- Width: the embedding width d, the heads H and the MLP width m each grow by
  an integer factor f. The residual stream is tiled, x' = [x, ..., x] (f_d
  copies), which leaves every RMSNorm's mean square, and so its output,
  unchanged. A kernel that reads the residual stream is tiled along its
  input axis and divided by f_d; one that writes to it is tiled along its
  output axis. Heads and MLP units are tiled likewise: the kernels that make
  them tile their output axis, the kernels that sum them (attention `out`,
  MLP `wo`) tile their input axis and divide by f_H or f_m.
- A shared-encoder draft's `encoder_projection` [E, d] writes the encoding
  its cross-attention reads: it tiles along its output axis, like any kernel
  that writes to the residual stream. With every factor 1 and no layers
  appended, growth is the identity: a trained model restarts as it is.
- Depth: stacks grow by appending layers whose output kernels (attention
  `out` and MLP `wo`) are zero, so each is the identity on the residual
  stream; their other kernels keep their random initialization, so the
  zeroed kernels receive gradients from the first step.

Dropout in training gives the copies of a unit different masks, which breaks
their symmetry.
"""

from flax import traverse_util
import numpy as np

from spec_decode import checkpoints
from spec_decode.models import t5

# The kernels that write to the residual stream; those of appended layers
# start at zero.
_OUTPUT_KERNELS = ("out", "wo")


class GrowthError(ValueError):
  """The source cannot grow into the target's shapes."""


def _factor(small, large, what):
  if large % small:
    raise GrowthError(
        f"cannot grow {what} from {small} to {large}: not an integer multiple"
    )
  return large // small


def _tile(x, axis, factor, divide=False):
  """x tiled `factor` times along `axis` ([..., n, ...] -> [..., f*n, ...])."""
  reps = [1] * x.ndim
  reps[axis] = factor
  tiled = np.tile(x, reps)
  return tiled / factor if divide else tiled


def _tile_heads(x, axis, factor, head_dim, divide=False):
  """Tiles the heads of an [.., H*Dh, ..] axis: heads h and h + k*H agree."""
  shape = x.shape
  # [.., H*Dh, ..] -> [.., H, Dh, ..]
  split = x.reshape(shape[:axis] + (-1, head_dim) + shape[axis + 1 :])
  tiled = _tile(split, axis, factor, divide)
  # [.., f*H, Dh, ..] -> [.., f*H*Dh, ..]
  return tiled.reshape(shape[:axis] + (-1,) + shape[axis + 1 :])


def _grow_leaf(path, small, large, factors, head_dim):
  """One grown leaf, of `large`'s shape, from `small` (see module doc)."""
  f_d, f_h, f_m = factors
  name = path[-2] if path[-1] == "kernel" else path[-1]
  if path[-1] == "scale":  # RMSNorm [d]
    return _tile(small, 0, f_d)
  if name == "embedding":  # [V, d]
    return _tile(small, 1, f_d)
  if name == "rel_embedding":  # [H, buckets]
    return _tile(small, 0, f_h)
  if name == "logits_dense":  # [d, V]
    return _tile(small, 0, f_d, divide=True)
  if name in ("query", "key", "value"):  # [d, H*Dh]
    grown = _tile(small, 0, f_d, divide=True)
    return _tile_heads(grown, 1, f_h, head_dim)
  if name == "out":  # [H*Dh, d]
    grown = _tile_heads(small, 0, f_h, head_dim, divide=True)
    return _tile(grown, 1, f_d)
  if name in ("wi", "wi_0", "wi_1"):  # [d, m]
    return _tile(_tile(small, 0, f_d, divide=True), 1, f_m)
  if name == "wo":  # [m, d]
    return _tile(_tile(small, 0, f_m, divide=True), 1, f_d)
  if name == "encoder_projection":  # [E, d]
    return _tile(small, 1, f_d)
  raise GrowthError(f"no growth rule for parameter {'/'.join(path)}")


def _check_same(source, target, what):
  if source != target:
    raise GrowthError(f"cannot grow: {what} differs ({source} vs {target})")


def grow(source, init, head_dim):
  """The params of the larger model `init`'s tree, computing `source`'s logits.

  Args:
    source: the trained model's params (the t5x tree of T5 1.1, any float
      dtype).
    init: the larger model's freshly initialized params (`t5.init_params`):
      the shapes to grow into, and the weights of appended layers.
    head_dim: Dh, the same in both models.

  Returns:
    A float32 tree of `init`'s structure and shapes.

  Raises:
    GrowthError: a dimension shrinks or grows by a non-integer factor, a
      model has a layer kind the other lacks, or the head widths differ.
  """
  small = traverse_util.flatten_dict(source)
  large = traverse_util.flatten_dict(init)
  if ("decoder", "logits_dense", "kernel") not in large:
    raise GrowthError(
        "cannot grow a model whose logits reuse the embedding (T5 1.0): "
        "tiling the embedding would scale its logits"
    )
  emb = small[("token_embedder", "embedding")].shape
  big_emb = large[("token_embedder", "embedding")].shape
  _check_same(emb[0], big_emb[0], "the vocabulary size")
  f_d = _factor(emb[1], big_emb[1], "the embedding width")
  heads = small[("decoder", "relpos_bias", "rel_embedding")].shape[0]
  big_heads = large[("decoder", "relpos_bias", "rel_embedding")].shape[0]
  f_h = _factor(heads, big_heads, "the number of heads")
  mlp = small[("decoder", "layers_0", "mlp", "wo", "kernel")].shape[0]
  big_mlp = large[("decoder", "layers_0", "mlp", "wo", "kernel")].shape[0]
  f_m = _factor(mlp, big_mlp, "the MLP width")
  query = small[("decoder", "layers_0", "self_attention", "query", "kernel")]
  _check_same(query.shape[1] // heads, head_dim, "the head width")
  for path in small:
    if path not in large:
      raise GrowthError(
          f"cannot grow: the target has no parameter {'/'.join(path)} "
          "(fewer layers, or another layer kind)"
      )
  grown = {}
  for path, leaf in large.items():
    if path in small:
      value = _grow_leaf(
          path,
          np.asarray(small[path], np.float32),
          leaf,
          (f_d, f_h, f_m),
          head_dim,
      )
      _check_same(value.shape, leaf.shape, f"the grown shape of {path}")
    elif path[-2] in _OUTPUT_KERNELS:
      value = np.zeros(leaf.shape, np.float32)
    else:
      value = np.asarray(leaf, np.float32)
    grown[path] = value.astype(np.float32)
  return traverse_util.unflatten_dict(grown)


def grown_params(path, source_config, config, rng):
  """The checkpoint at `path` (a `source_config` T5) grown into `config`.

  Args:
    path: any checkpoint `checkpoints.load_params` reads.
    source_config: the T5Config of that checkpoint.
    config: the larger model's T5Config.
    rng: a jax key, for the weights of appended layers.

  Returns:
    The grown float32 params (see `grow`).
  """
  source = checkpoints.load_params(path, t5.param_shapes(source_config))
  return grow(source, t5.init_params(config, rng), config.head_dim)
