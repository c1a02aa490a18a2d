"""What a decode call costs as compiled, from abstract shapes (no weights).

XLA's `cost_analysis()` of a compiled decode call gives its flops and the
bytes it reads and writes. A memory-bound decode call should read little more
than what it must: the parameters on the decoder path and the K/V entries up
to the rows' lengths. This module compares the two, and lists the compiled
instructions that copy or transpose an array as large as one layer's
self-attention cache, which no decode step needs. Beside XLA's count it sets
the off-chip bytes of the compiled program's buffers (`hlo_traffic`): a TPU
compile's `cost_analysis()` also counts the weights it prefetches into VMEM,
several times over.

  report = call_costs(config, batch_size=32, num_tokens=8, input_len=256,
                      capacity=264, filled=128)
"""

import dataclasses
import functools
import math
import re

import jax
from jax.experimental import topologies
from jax.experimental.layout import Format
from jax.experimental.layout import Layout
import jax.numpy as jnp

from spec_decode import drafts
from spec_decode import hlo_traffic
from spec_decode import key_buckets
from spec_decode.models import t5
from spec_decode.models.config import T5Config

# Parameters a decode call never reads: the encoder runs once per input, and
# the decoder's cross-attention keys and values are projected into the cache
# once, when it is set up.
_NOT_ON_DECODE_PATH = re.compile(
    r"^encoder/|encoder_decoder_attention/(key|value)/"
)
# HLO opcodes that move an array without computing anything.
_MOVES = ("copy", "transpose")
# `%name = f32[32,264,64,128]{3,2,1,0} copy(...)`: the result's element type
# and dimensions, then the opcode.
_INSTRUCTION = re.compile(
    r"=\s*(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\][^ ]*\s+(?P<op>[\w-]+)\("
)


@dataclasses.dataclass(frozen=True)
class CallCosts:
  """One compiled decode call's costs.

  Attributes:
    flops: XLA's count of floating-point operations.
    bytes_accessed: XLA's count of bytes read and written.
    offchip_bytes: the bytes of the entry instructions' off-chip operands
      and results, each read or written once (`hlo_traffic.offchip_bytes`):
      on a TPU compile, what HBM must move; on a CPU one, every operand.
    param_bytes: bytes of the parameters the call must read: the decoder
      stack and logits layer, less the cross-attention key and value kernels,
      plus the embedding rows it looks up (or the whole embedding when the
      logits come through it).
    cache_bytes: bytes of the self-attention K/V up to the rows' lengths after
      the call, and of the cross-attention K/V over the whole input.
    hlo_ops: instructions in the compiled module.
    cache_moves: the compiled instructions (opcode and result shape) that copy
      or transpose an array at least as large as one layer's self-attention
      keys.
    key_limit: the cache positions the call's self-attention reads: the
      smallest of the cache's bounds (`key_buckets.cache_bounds`, with
      `config.attention_buckets`) that holds the rows' lengths after the call.
      The call is compiled on the cache cut to it, as the body of the decode
      loop that runs at these lengths carries it.
  """

  flops: float
  bytes_accessed: float
  offchip_bytes: int
  param_bytes: int
  cache_bytes: int
  hlo_ops: int
  cache_moves: tuple[str, ...]
  key_limit: int

  @property
  def bytes_over_needed(self):
    """bytes_accessed / (param_bytes + cache_bytes): 1 reads nothing extra."""
    return self.bytes_accessed / (self.param_bytes + self.cache_bytes)

  @property
  def offchip_over_needed(self):
    """offchip_bytes / (param_bytes + cache_bytes)."""
    return self.offchip_bytes / (self.param_bytes + self.cache_bytes)


def _nbytes(shape_dtype):
  return math.prod(shape_dtype.shape) * jnp.dtype(shape_dtype.dtype).itemsize


def _abstract_params(config):
  """The parameter tree as ShapeDtypeStructs in the config's dtype."""
  dtype = jnp.dtype(config.dtype)
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, dtype), t5.param_shapes(config)
  )


def decode_path_param_bytes(config, params, num_lookups):
  """Bytes of the parameters one decode call reads (see CallCosts)."""
  total = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = "/".join(key.key for key in path)
    if _NOT_ON_DECODE_PATH.search(name):
      continue
    if name == "token_embedder/embedding" and not config.logits_via_embedding:
      total += num_lookups * _nbytes(leaf) // leaf.shape[0]
      continue
    total += _nbytes(leaf)
  return total


def needed_cache_bytes(cache, filled):
  """K/V bytes a call reads: self-attention up to `filled`, all of cross."""
  self_kv = sum(
      _nbytes(x) * filled // cache.max_length for x in cache.keys + cache.values
  )
  cross_kv = sum(_nbytes(x) for x in cache.cross_keys + cache.cross_values)
  return self_kv + cross_kv


def cache_moves(hlo_text, min_bytes):
  """Copies and transposes in `hlo_text` whose result has >= min_bytes."""
  moves = []
  for line in hlo_text.splitlines():
    match = _INSTRUCTION.search(line)
    if not match or match["op"] not in _MOVES:
      continue
    result = f"{match['dtype']}[{match['dims']}]"
    if hlo_traffic.array_bytes(result, offchip_only=False) >= min_bytes:
      moves.append(f"{match['op']} {result}")
  return tuple(moves)


def _count_instructions(hlo_text):
  return sum(1 for line in hlo_text.splitlines() if _INSTRUCTION.search(line))


def tpu_device(topology):
  """The first chip of a TPU topology (e.g. 'v5p:2x2x1'), for compiling.

  Needs libtpu (`pip install "libtpu==0.0.42.*"`, the version jax 0.10.2's
  `jax[tpu]` pins), not a TPU: XLA's TPU compiler runs on this host.
  """
  try:
    description = topologies.get_topology_desc(
        topology_name=topology, platform="tpu"
    )
  except (RuntimeError, ValueError) as e:
    raise ValueError(
        f"cannot compile for TPU topology {topology!r} (is libtpu "
        f"installed?): {str(e).splitlines()[0]}"
    ) from None
  return description.devices[0]


def call_costs(
    config: T5Config,
    batch_size: int,
    num_tokens: int,
    input_len: int,
    capacity: int,
    filled: int,
    device: jax.Device | None = None,
) -> CallCosts:
  """Compiles one decode call and reports its costs.

  Args:
    config: the model; its dtype is the parameters' and activations'.
    batch_size: rows per call.
    num_tokens: tokens per row in the call (1 for a step, gamma + 1 to
      verify).
    input_len: encoder tokens per row.
    capacity: the cache's positions.
    filled: the rows' lengths before the call.
    device: None compiles for this host's default device, with row-major
      operands. Else for this device (one of a TPU topology description
      compiles for a TPU without one, `tpu_device`), with the operands'
      layouts left to the compiler.

  Returns:
    The call's CallCosts.
  """
  model = t5.Transformer(config)
  params = _abstract_params(config)
  inputs = jax.ShapeDtypeStruct((batch_size, input_len), jnp.int32)
  cache = jax.eval_shape(
      functools.partial(drafts.t5_cache, model, max_length=capacity),
      params,
      inputs,
  )
  key_limit = key_buckets.bound_for(cache, filled + num_tokens)
  cache = jax.eval_shape(
      functools.partial(key_buckets.resized, length=key_limit), cache
  )
  tokens = jax.ShapeDtypeStruct((batch_size, num_tokens), jnp.int32)

  def call(params, tokens, cache):
    return t5.make_decode_fn(model, params)(tokens, cache)

  placement = {}
  if device is not None:
    # Every operand and result in the layout the compiler prefers, as a
    # while loop's carry gets it: a single call compiled with row-major
    # operands would count relayouts that a decode loop does once, on entry.
    placed = jax.sharding.SingleDeviceSharding(device)
    params, tokens, cache = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed),
        (params, tokens, cache),
    )
    free = Format(Layout.AUTO, placed)
    placement = dict(
        in_shardings=jax.tree.map(lambda _: free, (params, tokens, cache)),
        out_shardings=free,
    )
  # The cache is donated, as the decode loops carry it: a call updates it in
  # place rather than copying what it does not write.
  jitted = jax.jit(call, donate_argnums=2, **placement)
  compiled = jitted.lower(params, tokens, cache).compile()
  analysis = compiled.cost_analysis()
  # One dict, or (older jax) a list holding one per program.
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0]
  hlo_text = compiled.as_text()
  return CallCosts(
      flops=float(analysis.get("flops", 0.0)),
      bytes_accessed=float(analysis.get("bytes accessed", 0.0)),
      offchip_bytes=hlo_traffic.offchip_bytes(hlo_text),
      param_bytes=decode_path_param_bytes(
          config, params, batch_size * num_tokens
      ),
      cache_bytes=needed_cache_bytes(cache, filled + num_tokens),
      hlo_ops=_count_instructions(hlo_text),
      cache_moves=cache_moves(hlo_text, _nbytes(cache.keys[0])),
      key_limit=key_limit,
  )
