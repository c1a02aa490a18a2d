"""Sharded decoding on 8 simulated CPU devices (see conftest.py).

On every mesh the decoders emit the tokens of one device, greedy and sampled
with the same seed; parameters, caches and inputs are placed as the rules
say; a sharded checkpoint load reads each shard's slice once.
"""

import dataclasses
import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax.sharding import PartitionSpec as P
import numpy as np

from spec_decode import checkpoints
from spec_decode import decoding
from spec_decode import draft_loop
from spec_decode import drafts
from spec_decode import engine
from spec_decode import inputs as inputs_lib
from spec_decode import partitioning
from spec_decode import sampling
from spec_decode import speculative
from spec_decode.checkpoints import tensorstore_leaf
from spec_decode.models import t5

MESHES = ((8, 1), (1, 8), (2, 4), (4, 2))
MAX_DECODE_LEN = 12
GAMMA = 3
# Every sharded dimension divides by 8: heads, mlp, vocab, joined_kv.
TARGET = t5.T5Config(
    vocab_size=64,
    emb_dim=16,
    num_heads=8,
    head_dim=4,
    mlp_dim=32,
    num_encoder_layers=2,
    num_decoder_layers=2,
)
DRAFT = t5.T5Config(
    vocab_size=64,
    emb_dim=8,
    num_heads=8,
    head_dim=2,
    mlp_dim=16,
    num_encoder_layers=1,
    num_decoder_layers=1,
)
SHARED_DRAFT = dataclasses.replace(
    DRAFT, num_encoder_layers=0, shared_encoder_dim=TARGET.emb_dim
)
DEMO_TARGET = os.path.join(
    os.path.dirname(__file__), os.pardir, "spec_decode", "demo", "target"
)


def make_engine(
    mesh_shape, params, draft_params, replicate_draft=False, draft=DRAFT
):
  mesh = partitioning.make_mesh(
      model_parallel=mesh_shape[1], num_devices=mesh_shape[0] * mesh_shape[1]
  )
  draft_rules = partitioning.rules(replicate_model=replicate_draft)
  return engine.Engine(
      mesh,
      t5.Transformer(TARGET),
      engine.place_params(
          params, t5.param_logical_axes(TARGET), mesh, partitioning.rules()
      ),
      t5.Transformer(draft),
      engine.place_params(
          draft_params, t5.param_logical_axes(draft), mesh, draft_rules
      ),
      draft_rules=draft_rules,
  )


def decode(decoders, rows):
  """Baseline and speculative sequences, greedy and sampled."""
  placed = decoders.place_inputs(rows)
  outputs = {}
  for temperature in (0.0, 1.0):
    config = sampling.SamplingConfig(temperature)
    rng = jax.random.key(3)
    baseline = decoders.baseline(
        placed, rng, max_decode_len=MAX_DECODE_LEN, config=config
    )
    spec = decoders.speculative(
        placed, rng, gamma=GAMMA, max_decode_len=MAX_DECODE_LEN, config=config
    )
    outputs[temperature] = (
        np.asarray(baseline.sequences),
        np.asarray(spec.sequences),
    )
  return outputs


def random_params():
  """Host parameters of TARGET and DRAFT, the same in every process."""
  return (
      jax.device_get(t5.init_params(TARGET, jax.random.key(0))),
      jax.device_get(t5.init_params(DRAFT, jax.random.key(1))),
  )


def inputs():
  """int32 [8, 7] inputs, rows of different lengths."""
  rows = np.random.default_rng(0).integers(2, 64, (8, 7))
  rows[1::2, 5:] = 0
  return rows.astype(np.int32)


class ShardedDecodingTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.params, cls.draft_params = random_params()
    cls.inputs = inputs()
    cls.reference = decode(
        make_engine((1, 1), cls.params, cls.draft_params), cls.inputs
    )

  def test_reference_is_lossless_and_varied(self):
    baseline, spec = self.reference[0.0]
    np.testing.assert_array_equal(baseline, spec)
    # Sampling differs from greedy, so the sampled comparison means something.
    self.assertFalse(np.array_equal(self.reference[1.0][0], baseline))

  @parameterized.parameters(*MESHES)
  def test_same_tokens_as_one_device(self, data, model):
    outputs = decode(
        make_engine((data, model), self.params, self.draft_params), self.inputs
    )
    for temperature, (baseline, spec) in outputs.items():
      with self.subTest(temperature=temperature):
        np.testing.assert_array_equal(baseline, self.reference[temperature][0])
        np.testing.assert_array_equal(spec, self.reference[temperature][1])

  def test_replicated_draft_gives_the_same_tokens(self):
    outputs = decode(
        make_engine(
            (2, 4), self.params, self.draft_params, replicate_draft=True
        ),
        self.inputs,
    )
    for temperature, (_, spec) in outputs.items():
      np.testing.assert_array_equal(spec, self.reference[temperature][1])

  def test_parameter_cache_and_input_shardings_follow_the_rules(self):
    decoders = make_engine((2, 4), self.params, self.draft_params, True)
    mesh = decoders.mesh
    self.assertEqual(dict(mesh.shape), {"data": 2, "model": 4})
    params = decoders.target_params
    expected = {
        "token_embedder/embedding": P("model", None),  # vocab, embed
        "decoder/layers_0/self_attention/query/kernel": P(None, "model"),
        "decoder/layers_0/self_attention/out/kernel": P("model", None),
        "decoder/layers_0/mlp/wi_0/kernel": P(None, "model"),
        "decoder/layers_0/mlp/wo/kernel": P("model", None),
        "decoder/relpos_bias/rel_embedding": P("model", None),  # heads, buckets
        "decoder/logits_dense/kernel": P(None, "model"),
        "decoder/decoder_norm/scale": P(None),
    }
    for name, spec in expected.items():
      leaf = params
      for key in name.split("/"):
        leaf = leaf[key]
      self.assertEqual(leaf.sharding.spec, spec, name)
      self.assertEqual(leaf.sharding.mesh.shape, mesh.shape)
    # The replicated draft keeps whole copies.
    for leaf in jax.tree.leaves(decoders.draft_params):
      self.assertTrue(leaf.sharding.is_fully_replicated)

    inputs = decoders.place_inputs(self.inputs)
    self.assertEqual(inputs.sharding.spec, P("data", None))
    cache = decoders.setup("target", inputs, 16).cache
    for keys in cache.keys + cache.values + cache.cross_keys:
      self.assertEqual(keys.sharding.spec, P("data", "model", None, None))
    self.assertEqual(cache.lengths.sharding.spec, P("data"))
    self.assertEqual(cache.encoder_mask.sharding.spec, P("data", None))
    draft_cache = decoders.setup("draft", inputs, 16).cache
    self.assertEqual(
        draft_cache.keys[0].sharding.spec, P("data", None, None, None)
    )

  def test_loops_donate_the_caches(self):
    decoders = make_engine((2, 4), self.params, self.draft_params)
    placed = decoders.place_inputs(self.inputs)
    target = decoders.setup("target", placed, MAX_DECODE_LEN + GAMMA + 1)
    draft = decoders.setup("draft", placed, MAX_DECODE_LEN + GAMMA + 1)
    decoders._loop(  # pylint: disable=protected-access
        engine._speculative_loop,  # pylint: disable=protected-access
        (target.decode_fn, draft.decode_fn, target.cache, draft.cache)
        + (decoders._place_key(jax.random.key(3)),)  # pylint: disable=protected-access
        + (decoders._place(sampling.SamplingConfig(0.0)),)  # pylint: disable=protected-access
        + (decoders._place(draft_loop.Threshold(0.0)),),  # pylint: disable=protected-access
        donate=(2, 3),
        gamma=GAMMA,
        max_decode_len=MAX_DECODE_LEN,
        verifier="block",
    )
    for leaf in jax.tree.leaves((target.cache, draft.cache)):
      self.assertTrue(leaf.is_deleted())
    for leaf in jax.tree.leaves(decoders.target_params):
      self.assertFalse(leaf.is_deleted())

  def test_target_as_its_own_draft_encodes_once(self):
    mesh = partitioning.make_mesh(model_parallel=4, num_devices=8)
    decoders = engine.Engine(
        mesh,
        t5.Transformer(TARGET),
        engine.place_params(
            self.params,
            t5.param_logical_axes(TARGET),
            mesh,
            partitioning.rules(),
        ),
    )
    placed = decoders.place_inputs(self.inputs)
    with mock.patch.object(
        engine.Engine,
        "_t5_cache",
        autospec=True,
        side_effect=engine.Engine._t5_cache,  # pylint: disable=protected-access
    ) as encode:
      target, draft = decoders.setup_pair(placed, 16)
    encode.assert_called_once()
    for mine, theirs in zip(
        jax.tree.leaves(target.cache), jax.tree.leaves(draft.cache)
    ):
      np.testing.assert_array_equal(mine, theirs)
      self.assertEqual(mine.sharding, theirs.sharding)
      # Separate buffers: the loop donates both caches.
      self.assertNotEqual(
          mine.addressable_shards[0].data.unsafe_buffer_pointer(),
          theirs.addressable_shards[0].data.unsafe_buffer_pointer(),
      )
    # Every drafted token is the target's own: greedy, all accepted.
    config = sampling.SamplingConfig(0.0)
    rng = jax.random.key(3)
    baseline = decoders.baseline(
        placed, rng, max_decode_len=MAX_DECODE_LEN, config=config
    )
    spec = decoders.speculative(
        placed, rng, gamma=GAMMA, max_decode_len=MAX_DECODE_LEN, config=config
    )
    np.testing.assert_array_equal(spec.sequences, baseline.sequences)
    np.testing.assert_array_equal(spec.accepted_tokens, spec.drafted_tokens)

  def test_shared_encoder_draft_reads_the_target_encoding(self):
    draft_params = jax.device_get(
        t5.init_params(SHARED_DRAFT, jax.random.key(2))
    )
    outputs = {}
    for mesh_shape in ((1, 1), (2, 4)):
      decoders = make_engine(
          mesh_shape, self.params, draft_params, draft=SHARED_DRAFT
      )
      placed = decoders.place_inputs(self.inputs)
      with self.assertRaisesRegex(ValueError, "set it up with setup_pair"):
        decoders.setup("draft", placed, 16)
      target, draft = decoders.setup_pair(placed, 16)
      # The target's cache is the one it makes alone.
      alone = decoders.setup("target", placed, 16).cache
      for mine, theirs in zip(
          jax.tree.leaves(target.cache), jax.tree.leaves(alone)
      ):
        np.testing.assert_array_equal(mine, theirs)
        self.assertEqual(mine.sharding, theirs.sharding)
      self.assertEqual(
          draft.cache.cross_keys[0].sharding.spec,
          P("data", "model", None, None),
      )
      outputs[mesh_shape] = decode(decoders, self.inputs)
    for temperature, (baseline, spec) in outputs[(1, 1)].items():
      with self.subTest(temperature=temperature):
        np.testing.assert_array_equal(outputs[(2, 4)][temperature][1], spec)
        if temperature == 0.0:
          np.testing.assert_array_equal(baseline, spec)

  def test_indivisible_axis_is_a_one_line_error(self):
    mesh = partitioning.make_mesh(model_parallel=8)
    config = t5.T5Config(vocab_size=64, emb_dim=8, num_heads=2, head_dim=4)
    with self.assertRaisesRegex(
        ValueError,
        r"^decoder/relpos_bias/rel_embedding: an axis of size 2 cannot be "
        r"split 8 ways over mesh axis 'model'",
    ):
      partitioning.shardings(
          t5.param_shapes(config), t5.param_logical_axes(config), mesh
      )


class MakeMeshTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("too_many_devices", dict(num_devices=9), "num_devices must be an int"),
      # A bool is an int to Python: these were 1 device and no split.
      ("bool_devices", dict(num_devices=True), "num_devices must be an int"),
      ("bool_split", dict(model_parallel=True), "model_parallel must be a"),
      ("no_divisor", dict(model_parallel=3), "model_parallel must be a"),
  )
  def test_bad_settings_are_one_line(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, f"^make_mesh.{message}"):
      partitioning.make_mesh(**kwargs)

  def test_mesh_shape(self):
    mesh = partitioning.make_mesh(model_parallel=2, num_devices=4)
    self.assertEqual(dict(mesh.shape), {"data": 2, "model": 2})


class ShardedLoadTest(absltest.TestCase):

  def test_each_host_reads_only_its_shards(self):
    config = t5.T5Config(
        vocab_size=4096,
        emb_dim=256,
        num_heads=4,
        head_dim=64,
        mlp_dim=1024,
        num_encoder_layers=3,
        num_decoder_layers=3,
        mlp_activations=("gelu", "linear"),
        logits_via_embedding=False,
    )  # configs/models/demo_target.gin
    mesh = partitioning.make_mesh(model_parallel=4)  # (2, 4)
    shapes = t5.param_shapes(config)
    shardings = partitioning.shardings(
        shapes, t5.param_logical_axes(config), mesh
    )
    reads = []
    read = tensorstore_leaf.StoredArray.read

    def recording_read(leaf, dtype=None, index=()):
      reads.append(
          (leaf.location, tuple((s.start, s.stop, s.step) for s in index))
      )
      return read(leaf, dtype, index)

    tensorstore_leaf.StoredArray.read = recording_read
    try:
      sharded = checkpoints.load_params(DEMO_TARGET, shapes, None, shardings)
    finally:
      tensorstore_leaf.StoredArray.read = read
    whole = checkpoints.load_params(DEMO_TARGET, shapes, None)

    self.assertLen(reads, len(set(reads)))  # No slice is read twice.
    by_leaf = {}
    for location, index in reads:
      by_leaf.setdefault(location.split("/")[-1], []).append(index)
    wi = by_leaf["target.decoder.layers_0.mlp.wi_0.kernel"]
    self.assertEqual(
        sorted(index[1][:2] for index in wi),
        [(0, 256), (256, 512), (512, 768), (768, 1024)],
    )
    self.assertLen(by_leaf["target.decoder.decoder_norm.scale"], 1)
    for got, want in zip(jax.tree.leaves(sharded), jax.tree.leaves(whole)):
      np.testing.assert_array_equal(np.asarray(got), want)
    for got, sharding in zip(
        jax.tree.leaves(sharded), jax.tree.leaves(shardings)
    ):
      self.assertEqual(got.sharding, sharding)


def _plain_speculative(
    params, draft_params, rows, rng, config, draft_threshold=0.0
):
  """`speculative.speculative_decode` of TARGET and DRAFT on one device."""
  capacity = MAX_DECODE_LEN + GAMMA + 1
  target = drafts.t5_draft(t5.Transformer(TARGET), params, rows, capacity)
  draft = drafts.t5_draft(t5.Transformer(DRAFT), draft_params, rows, capacity)
  return speculative.speculative_decode(
      target.decode_fn,
      draft.decode_fn,
      target.cache,
      draft.cache,
      rng,
      gamma=GAMMA,
      max_decode_len=MAX_DECODE_LEN,
      eos_id=inputs_lib.EOS_ID,
      config=config,
      draft_threshold=draft_threshold,
  )


class KeyTest(absltest.TestCase):
  """Every process samples with the caller's key itself.

  The other tests compare the Engine with itself on a (1, 1) mesh, which a
  key derived from the process (or the mesh) would pass. Here the Engine's
  sampled tokens equal the plain decoders' on the host with the same key,
  and the key the Engine places is the caller's whatever the process index.
  """

  def test_sampled_tokens_equal_the_plain_decoders(self):
    params, draft_params = random_params()
    rows = inputs()
    config = sampling.SamplingConfig(1.0)
    rng = jax.random.key(3)
    spec = _plain_speculative(params, draft_params, rows, rng, config)
    target = drafts.t5_draft(
        t5.Transformer(TARGET), params, rows, MAX_DECODE_LEN
    )
    baseline = decoding.autoregressive_decode(
        target.decode_fn,
        target.cache,
        rng,
        max_decode_len=MAX_DECODE_LEN,
        eos_id=inputs_lib.EOS_ID,
        config=config,
    )
    got = decode(make_engine((2, 4), params, draft_params), rows)[1.0]
    np.testing.assert_array_equal(got[0], baseline.sequences)
    np.testing.assert_array_equal(got[1], spec.sequences)

  def test_one_compiled_loop_for_every_temperature(self):
    """The Engine places the temperature as an array: the loop it compiled
    at 1.0 samples at 0.7 as the plain decoder does at 0.7."""
    params, draft_params = random_params()
    rows = inputs()
    decoders = make_engine((2, 4), params, draft_params)
    placed = decoders.place_inputs(rows)
    rng = jax.random.key(3)
    engine.clear_compiled()
    for temperature in (1.0, 0.7):
      got = decoders.speculative(
          placed,
          rng,
          gamma=GAMMA,
          max_decode_len=MAX_DECODE_LEN,
          config=sampling.SamplingConfig(temperature),
      )
    loops = [
        key
        for key in engine._COMPILED  # pylint: disable=protected-access
        if key[0] is engine._speculative_loop  # pylint: disable=protected-access
    ]
    self.assertLen(loops, 1)
    spec = _plain_speculative(
        params, draft_params, rows, rng, sampling.SamplingConfig(0.7)
    )
    np.testing.assert_array_equal(got.sequences, spec.sequences)

  def test_one_compiled_loop_for_every_draft_threshold_above_0(self):
    """The Engine places the threshold as an array: the loop it compiled at
    0.3 stops early at 0.05 as the plain decoder does at 0.05. Threshold 0,
    which never stops early, has a loop of its own (unrolled draft calls)."""
    params, draft_params = random_params()
    rows = inputs()
    decoders = make_engine((2, 4), params, draft_params)
    placed = decoders.place_inputs(rows)
    rng = jax.random.key(3)
    config = sampling.SamplingConfig(1.0)
    engine.clear_compiled()
    got = {}
    for threshold in (0.3, 0.05, 0.0):
      got[threshold] = decoders.speculative(
          placed,
          rng,
          gamma=GAMMA,
          max_decode_len=MAX_DECODE_LEN,
          config=config,
          draft_threshold=threshold,
      )
    loops = [
        key
        for key in engine._COMPILED  # pylint: disable=protected-access
        if key[0] is engine._speculative_loop  # pylint: disable=protected-access
    ]
    self.assertLen(loops, 2)
    for threshold in (0.05, 0.0):
      spec = _plain_speculative(
          params, draft_params, rows, rng, config, threshold
      )
      np.testing.assert_array_equal(got[threshold].sequences, spec.sequences)
      np.testing.assert_array_equal(
          got[threshold].draft_calls, spec.draft_calls
      )
    # The two thresholds stopped differently (at 0.3 every row stops after
    # its first draft here): the test tells them apart.
    self.assertFalse(
        np.array_equal(got[0.3].draft_calls, got[0.05].draft_calls)
    )

  def test_one_compiled_set_up_for_every_gamma_under_a_step(self):
    """The caches' room past max_decode_len does not depend on gamma."""
    decoders = make_engine((1, 1), *random_params())
    placed = decoders.place_inputs(inputs())
    engine.clear_compiled()
    lengths = set()
    for gamma in range(1, drafts.CAPACITY_STEP):
      pair = decoders.speculative_setup(
          placed, gamma=gamma, max_decode_len=MAX_DECODE_LEN
      )
      lengths |= {draft.cache.max_length for draft in pair}
    self.assertEqual(lengths, {MAX_DECODE_LEN + drafts.CAPACITY_STEP})
    set_ups = [key for key in engine._COMPILED if key[0] == "cache"]  # pylint: disable=protected-access
    self.assertLen(set_ups, 2)  # The target's and the draft's.

  def test_placed_key_is_the_callers_in_every_process(self):
    decoders = make_engine((2, 4), *random_params())
    rng = jax.random.key(3)
    for process_index in (0, 1):
      with mock.patch.object(jax, "process_index", return_value=process_index):
        placed = decoders._place_key(rng)  # pylint: disable=protected-access
      np.testing.assert_array_equal(placed, jax.random.key_data(rng))


if __name__ == "__main__":
  absltest.main()
