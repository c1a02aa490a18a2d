"""The compiled, sharded decoders of a target/draft pair on one device mesh.

Each decode is two compiled calls:

1. set-up: encode a batch and create the decode caches. Their shardings come
   from `jax.eval_shape` and the caches' logical axes, and are the call's
   out_shardings, so every cache is created in place, sharded;
2. the loop (`decoding.autoregressive_decode` or
   `speculative.speculative_decode`), with in_shardings from its arguments,
   replicated out_shardings for the result (every host can read it), and
   the caches donated: the loop carries them in place and returns them in
   the same memory, so no copy of a cache is made.

Target and draft share the mesh; each has its own rules (a small draft may
be replicated over 'model'). Inputs are fed per host (`partitioning.place`).
"""

import functools
import jax
import numpy as np

from spec_decode import decoding
from spec_decode import draft_loop
from spec_decode import drafts
from spec_decode import inputs as inputs_lib
from spec_decode import lookup
from spec_decode import partitioning
from spec_decode import speculative
from spec_decode.models import t5

_INPUT_AXES = jax.sharding.PartitionSpec("batch", "length")
# Compiled set-up and loop functions, shared by every Engine (a benchmark
# sweep builds one per point), keyed by what they were compiled for.
_COMPILED = {}


class Engine:
  """Baseline and speculative decoding of one pair on one mesh.

  Attributes:
    mesh: the device mesh.
    target_model, target_params: the target T5 and its (sharded) parameters.
    draft_model, draft_params: a T5 draft and its parameters; or None and an
      `drafts.NgramModel` or a `lookup.PromptLookup`; or None and None for
      the target as its own draft.
    target_rules, draft_rules: each model's logical-axis rules.
  """

  def __init__(
      self,
      mesh,
      target_model,
      target_params,
      draft_model=None,
      draft_params=None,
      target_rules=partitioning.LOGICAL_AXIS_RULES,
      draft_rules=partitioning.LOGICAL_AXIS_RULES,
  ):
    self.mesh = mesh
    self.target_model = target_model
    self.target_params = target_params
    self.draft_model = draft_model
    self.draft_params = draft_params
    self.target_rules = target_rules
    self.draft_rules = draft_rules

  def place_inputs(self, inputs: np.ndarray) -> jax.Array:
    """int32 [B, S] host inputs -> rows split over 'data' (B must divide)."""
    sharding = partitioning.shardings(
        jax.ShapeDtypeStruct(inputs.shape, inputs.dtype),
        _INPUT_AXES,
        self.mesh,
        self.target_rules,
    )
    return partitioning.place(inputs, sharding)

  def baseline(self, inputs, rng, *, max_decode_len, config):
    """`decoding.autoregressive_decode` of the target on placed inputs."""
    target_fn, cache = self.baseline_setup(
        inputs, max_decode_len=max_decode_len
    )
    args = (target_fn, cache, self._place_key(rng), self._place(config))
    return self._loop(
        _baseline_loop, args, donate=(1,), max_decode_len=max_decode_len
    )

  def speculative(
      self,
      inputs,
      rng,
      *,
      gamma,
      max_decode_len,
      config,
      verifier="block",
      draft_threshold=0.0,
  ):
    """`speculative.speculative_decode` of the pair on placed inputs."""
    (target_fn, target_cache), (draft_fn, draft_cache) = self.speculative_setup(
        inputs, gamma=gamma, max_decode_len=max_decode_len
    )
    args = (target_fn, draft_fn, target_cache, draft_cache)
    args += (self._place_key(rng), self._place(config))
    args += (self._place(draft_loop.Threshold(draft_threshold)),)
    return self._loop(
        _speculative_loop,
        args,
        donate=(2, 3),
        gamma=gamma,
        max_decode_len=max_decode_len,
        verifier=verifier,
    )

  def baseline_setup(self, inputs, *, max_decode_len) -> drafts.Draft:
    """What `baseline` does before its loop: the target's encoding and cache."""
    return self.setup("target", inputs, max_decode_len)

  def speculative_setup(self, inputs, *, gamma, max_decode_len):
    """What `speculative` does before its loop: both models' caches.

    Returns:
      (target Draft, draft Draft), their caches holding
      `drafts.speculative_capacity` positions (the last target call may
      overrun max_decode_len by gamma + 1).
    """
    capacity = drafts.speculative_capacity(max_decode_len, gamma)
    return self.setup_pair(inputs, capacity)

  def setup(self, which, inputs, capacity) -> drafts.Draft:
    """A model's decode function and a fresh, sharded cache for `inputs`.

    Args:
      which: 'target' or 'draft'.
      inputs: int32 [B, S] placed inputs.
      capacity: the cache's positions.

    Returns:
      The Draft (decode function and empty cache).
    """
    if which == "target" or self.draft_params is None:
      return drafts.Draft(
          t5.make_decode_fn(self.target_model, self.target_params),
          self._t5_cache("target", inputs, capacity),
      )
    if isinstance(self.draft_params, lookup.PromptLookup):
      return drafts.Draft(
          self.draft_params, self._lookup_cache(inputs, capacity)
      )
    if self.draft_model is None:
      ngram = self.draft_params
      return drafts.Draft(ngram, self._ngram_cache(inputs.shape[0]))
    if self.draft_model.config.shared_encoder_dim:
      raise ValueError(
          "a shared-encoder draft reads its target's encoding: set it up "
          "with setup_pair"
      )
    return drafts.Draft(
        t5.make_decode_fn(self.draft_model, self.draft_params),
        self._t5_cache("draft", inputs, capacity),
    )

  def setup_pair(self, inputs, capacity):
    """The target's and the draft's `setup`, encoding the inputs once each.

    The target as its own draft gets a copy of the target's fresh cache (the
    loop donates both caches, so they cannot share buffers) instead of a
    second pass of the target's encoder. A shared-encoder draft's cache is
    made from the target's encoding, in one call.

    Returns:
      (target Draft, draft Draft).
    """
    if (
        self.draft_model is not None
        and self.draft_model.config.shared_encoder_dim
    ):
      target_cache, draft_cache = self._shared_encoder_caches(inputs, capacity)
      return (
          drafts.Draft(
              t5.make_decode_fn(self.target_model, self.target_params),
              target_cache,
          ),
          drafts.Draft(
              t5.make_decode_fn(self.draft_model, self.draft_params),
              draft_cache,
          ),
      )
    target = self.setup("target", inputs, capacity)
    if self.draft_params is not None:
      return target, self.setup("draft", inputs, capacity)
    copy = jax.tree.map(lambda array: array.copy(), target.cache)
    return target, drafts.Draft(target.decode_fn, copy)

  def _t5_cache(self, which, inputs, capacity):
    model, params, rules = (
        (self.target_model, self.target_params, self.target_rules)
        if which == "target"
        else (self.draft_model, self.draft_params, self.draft_rules)
    )
    key = ("cache", self.mesh, rules, model, inputs.shape, capacity)
    if key not in _COMPILED:
      make = functools.partial(drafts.t5_cache, model, max_length=capacity)
      with partitioning.active(self.mesh, rules):
        shapes = jax.eval_shape(make, params, inputs)
        out_shardings = partitioning.shardings(
            shapes, shapes.logical_axes(), self.mesh, rules
        )
      _COMPILED[key] = jax.jit(make, out_shardings=out_shardings)
    with partitioning.active(self.mesh, rules):
      return _COMPILED[key](params, inputs)

  def _shared_encoder_caches(self, inputs, capacity):
    """Traced under the target's rules; each cache placed by its own."""
    key = ("shared_caches", self.mesh, self.target_rules, self.draft_rules)
    key += (self.target_model, self.draft_model, inputs.shape, capacity)
    if key not in _COMPILED:
      make = functools.partial(
          drafts.shared_encoder_caches,
          self.target_model,
          draft_model=self.draft_model,
          max_length=capacity,
      )
      with partitioning.active(self.mesh, self.target_rules):
        shapes = jax.eval_shape(
            make,
            self.target_params,
            draft_params=self.draft_params,
            encoder_input_tokens=inputs,
        )
      out_shardings = tuple(
          partitioning.shardings(shape, shape.logical_axes(), self.mesh, rules)
          for shape, rules in zip(shapes, (self.target_rules, self.draft_rules))
      )
      _COMPILED[key] = jax.jit(make, out_shardings=out_shardings)
    with partitioning.active(self.mesh, self.target_rules):
      return _COMPILED[key](
          self.target_params,
          draft_params=self.draft_params,
          encoder_input_tokens=inputs,
      )

  def _ngram_cache(self, batch_size):
    cache = self.draft_params.init_cache(batch_size)
    sharding = partitioning.shardings(
        cache, cache.logical_axes(), self.mesh, self.draft_rules
    )
    return jax.tree.map(partitioning.place, cache, sharding)

  def _lookup_cache(self, inputs, capacity):
    key = ("lookup_cache", self.mesh, self.draft_rules, inputs.shape, capacity)
    if key not in _COMPILED:
      make = functools.partial(lookup.init_cache, capacity=capacity)
      shapes = jax.eval_shape(make, inputs)
      out_shardings = partitioning.shardings(
          shapes, shapes.logical_axes(), self.mesh, self.draft_rules
      )
      _COMPILED[key] = jax.jit(make, out_shardings=out_shardings)
    with partitioning.active(self.mesh, self.draft_rules):
      return _COMPILED[key](inputs)

  def _place_key(self, rng):
    """The PRNG key's data, replicated: uint32 [2] for threefry."""
    return self._place(jax.random.key_data(rng))

  def _place(self, tree):
    """A pytree of host values, replicated: a key's data, or a sampling
    config or draft threshold, whose floats become float32 [] arrays (one
    compiled loop for all their values)."""
    replicated = partitioning.replicated(self.mesh)
    return jax.tree.map(
        lambda x: partitioning.place(
            np.float32(x) if isinstance(x, float) else x, replicated
        ),
        tree,
    )

  def _loop(self, decode, args, donate, **static):
    """decode(*args, **static) compiled with the arguments' shardings.

    Args:
      decode: the loop function.
      args: its array arguments (pytrees).
      donate: the positions in args of the caches, donated.
      **static: its static keyword arguments.

    Returns:
      The loop's result, replicated over the mesh.
    """
    leaves, treedef = jax.tree.flatten(args)
    key = (decode, self.mesh, treedef, tuple(sorted(static.items())))
    # dtype objects, not their names: str() of ~200 dtypes took 1-2 ms of
    # each decode call's dispatch (the demo pair).
    key += tuple((x.shape, x.dtype, x.sharding) for x in leaves)
    if key not in _COMPILED:
      in_shardings = jax.tree.map(lambda x: x.sharding, args)
      _COMPILED[key] = jax.jit(
          functools.partial(decode, **static),
          in_shardings=in_shardings,
          # The result, then the final caches in the donated caches' memory.
          out_shardings=(partitioning.replicated(self.mesh),)
          + tuple(in_shardings[i] for i in donate),
          donate_argnums=donate,
      )
    with partitioning.active(self.mesh, self.target_rules):
      return _COMPILED[key](*args)[0]


def _baseline_loop(target_fn, cache, key_data, config, *, max_decode_len):
  return decoding.autoregressive_decode(
      target_fn,
      cache,
      jax.random.wrap_key_data(key_data),
      max_decode_len=max_decode_len,
      eos_id=inputs_lib.EOS_ID,
      config=config,
      return_cache=True,
  )


def _speculative_loop(
    target_fn,
    draft_fn,
    target_cache,
    draft_cache,
    key_data,
    config,
    draft_threshold,
    *,
    gamma,
    max_decode_len,
    verifier,
):
  return speculative.speculative_decode(
      target_fn,
      draft_fn,
      target_cache,
      draft_cache,
      jax.random.wrap_key_data(key_data),
      gamma=gamma,
      max_decode_len=max_decode_len,
      eos_id=inputs_lib.EOS_ID,
      config=config,
      verifier=verifier,
      draft_threshold=draft_threshold,
      return_caches=True,
  )


def clear_compiled():
  """Frees every compiled decoder (and JAX's caches).

  XLA:CPU maps each compiled program into memory; a sweep that compiles
  hundreds (gammas x shapes) would exhaust the process's memory maps.
  """
  _COMPILED.clear()
  jax.clear_caches()


def place_ngram(ngram, mesh) -> drafts.NgramModel:
  """An n-gram draft's tables, replicated on every device of `mesh`."""
  replicated = partitioning.replicated(mesh)
  return jax.tree.map(lambda x: partitioning.place(x, replicated), ngram)


def place_params(params, logical_axes, mesh, rules):
  """Host parameters (the same on every host) onto `mesh`, sharded."""
  sharding = partitioning.shardings(params, logical_axes, mesh, rules)
  return jax.tree.map(partitioning.place, params, sharding)
