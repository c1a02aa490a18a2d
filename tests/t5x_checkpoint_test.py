"""spec_decode.checkpoints.t5x: T5X checkpoints, legacy (arrays inline,
chunked, or in tensorstore zarr directories, local or gs://) and Orbax-era.

The fixtures in tests/testdata are t5x's own test checkpoints (see
tests/testdata/PROVENANCE.md). Expected values are established without the
code under test: msgpack.unpackb over the whole file, gzip + numpy over zarr
chunks, and raw zstd blocks.
"""

import gzip
import os
import shutil
import struct
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from flax import serialization
from flax import traverse_util
import jax
import jax.numpy as jnp
import msgpack
import numpy as np
import tensorstore as ts

import checkpoint_fixtures
from checkpoint_fixtures import SMALL, TESTDATA, TINY, TINY_CHECKPOINT
from spec_decode import checkpoints
from spec_decode.checkpoints import msgpack_tree
from spec_decode.checkpoints import storage
from spec_decode.checkpoints import t5x
from spec_decode.checkpoints import tensorstore_leaf
from spec_decode.models import t5

_flat = checkpoint_fixtures.flat
_small_params = checkpoint_fixtures.small_params
_tempdir = checkpoint_fixtures.tempdir
_write_msgpack = checkpoint_fixtures.write_msgpack

# The toy optimizer state of tiny_t5 and tiny_orbax: name -> (dtype, shape).
TOY_STATE = {
    "param_states/bias": ("<f4", (5,)),
    "param_states/kernel": ("<f8", (10, 5)),
    "param_states/step": ("<i4", ()),
}


def _raw_target(path):
  """The params of a flax msgpack file, decoded whole by msgpack itself."""

  def ext_hook(code, data):
    shape, dtype, buffer = msgpack.unpackb(data)
    return np.frombuffer(buffer, jnp.dtype(dtype)).reshape(shape)

  with open(path, "rb") as f:
    state = msgpack.unpackb(f.read(), ext_hook=ext_hook)
  return state["optimizer"]["target"]


def _gunzip_chunk(directory, chunk, dtype, shape):
  with open(os.path.join(directory, chunk), "rb") as f:
    return np.frombuffer(gzip.decompress(f.read()), dtype).reshape(shape)


def _zstd_raw_block(path):
  """The payload of a zstd frame made of one raw (uncompressed) block."""
  with open(path, "rb") as f:
    frame = f.read()
  assert frame[:4] == b"\x28\xb5\x2f\xfd" and frame[4] == 0, frame[:5]
  # Header: magic, descriptor 0 (no size, checksum or dictionary), window.
  (header,) = struct.unpack("<I", frame[6:9] + b"\0")
  assert (header >> 1) & 3 == 0, "not a raw block"
  return frame[9 : 9 + (header >> 3)]


class T5xLegacyTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("file_float32", False, jnp.float32),
      ("directory_float32", True, jnp.float32),
      ("file_bfloat16", False, jnp.bfloat16),
  )
  def test_tiny_t5_loads_and_equals_raw_arrays(self, as_directory, dtype):
    path = TINY_CHECKPOINT
    if as_directory:
      path = os.path.join(_tempdir(self), "checkpoint_0")
      os.makedirs(path)
      shutil.copy(TINY_CHECKPOINT, os.path.join(path, "checkpoint"))
    params = checkpoints.load_params(path, t5.param_shapes(TINY), dtype)
    raw = _flat(_raw_target(TINY_CHECKPOINT))
    loaded = _flat(params)
    self.assertSameElements(loaded, _flat(t5.param_shapes(TINY)))
    for name, array in loaded.items():
      self.assertIsInstance(array, np.ndarray)
      self.assertEqual(array.dtype, jnp.dtype(dtype), name)
      np.testing.assert_array_equal(array, raw[name].astype(dtype), name)

  def test_dtype_none_keeps_expected_dtypes(self):
    expected = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, jnp.bfloat16),
        t5.param_shapes(TINY),
    )
    params = checkpoints.load_params(TINY_CHECKPOINT, expected, dtype=None)
    self.assertEqual(
        {a.dtype for a in jax.tree.leaves(params)}, {jnp.dtype(jnp.bfloat16)}
    )

  def test_tiny_t5_forward_pass(self):
    params = checkpoints.load_params(TINY_CHECKPOINT, t5.param_shapes(TINY))
    inputs = jnp.array([[5, 6, 7, 1], [8, 9, 1, 0]], jnp.int32)
    targets = jnp.array([[0, 3, 4], [0, 10, 11]], jnp.int32)
    logits = t5.Transformer(TINY).apply({"params": params}, inputs, targets)
    self.assertEqual(logits.shape, (2, 3, TINY.vocab_size))
    self.assertEqual(logits.dtype, jnp.float32)
    self.assertTrue(np.all(np.isfinite(logits)))

  def test_tiny_t5_forward_pass_matches_transformers(self):
    # transformers' T5 gets the raw msgpack arrays, not our loader's output.
    import hf_reference  # pylint: disable=g-import-not-at-top

    params = checkpoints.load_params(TINY_CHECKPOINT, t5.param_shapes(TINY))
    raw = jax.tree.map(np.asarray, _raw_target(TINY_CHECKPOINT))
    inputs = np.array([[5, 6, 7, 1], [8, 9, 1, 0]], np.int32)
    targets = np.array([[0, 3, 4], [0, 10, 11]], np.int32)
    logits = t5.Transformer(TINY).apply({"params": params}, inputs, targets)
    expected = hf_reference.logits(TINY, raw, inputs, targets)
    self.assertGreater(np.abs(expected).std(), 1e-3)
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-5)

  def test_optimizer_state_is_never_decoded(self):
    decode = mock.Mock(wraps=msgpack_tree._decode_ext)
    with mock.patch.object(msgpack_tree, "_decode_ext", decode):
      t5x.list_arrays(TINY_CHECKPOINT)
    self.assertEqual(decode.call_count, len(_flat(t5.param_shapes(TINY))))

  def test_chunked_arrays_are_joined(self):
    params = _small_params()
    # Make flax split every array of more than 16 floats into chunks.
    with mock.patch.object(serialization, "MAX_CHUNK_SIZE", 64):
      path = _write_msgpack(
          _tempdir(self),
          {"version": 3, "optimizer": {"target": params, "state": {}}},
      )
    with open(os.path.join(path, "checkpoint"), "rb") as f:
      self.assertIn(b"__msgpack_chunked_array__", f.read())
    loaded = checkpoints.load_params(path, t5.param_shapes(SMALL))
    jax.tree.map(np.testing.assert_array_equal, loaded, params)

  def test_target_at_top_level(self):
    params = _small_params()
    path = _write_msgpack(
        _tempdir(self),
        {
            "version": 3,
            "target": params,
            "state": {"step": np.int32(7), "param_states": params},
        },
    )
    loaded = checkpoints.load_params(path, t5.param_shapes(SMALL))
    jax.tree.map(np.testing.assert_array_equal, loaded, params)

  @parameterized.named_parameters(
      ("with_zarray", True), ("without_zarray", False)
  )
  def test_tensorstore_spec_params(self, keep_zarray):
    params = _small_params()
    directory = _tempdir(self)
    specs = {}
    for name, array in _flat(params).items():
      relative = "target." + name.replace("/", ".")
      spec = {
          "driver": "zarr",
          "dtype": "float32",
          "kvstore": {"driver": "gfile", "path": relative},
          "metadata": {
              "shape": list(array.shape),
              "chunks": [max(1, d // 2) for d in array.shape],
              "compressor": {"id": "gzip", "level": 1},
          },
      }
      local = dict(
          spec,
          kvstore={"driver": "file", "path": os.path.join(directory, relative)},
      )
      ts.open(local, create=True).result().write(array).result()
      if not keep_zarray:
        os.remove(os.path.join(directory, relative, ".zarray"))
      specs[name] = spec
    with open(os.path.join(directory, "checkpoint"), "wb") as f:
      f.write(
          msgpack.packb(
              {
                  "version": 3,
                  "optimizer": {
                      "target": traverse_util.unflatten_dict(specs, sep="/"),
                      "state": {},
                  },
              }
          )
      )
    loaded = checkpoints.load_params(
        directory, t5.param_shapes(SMALL), jnp.bfloat16
    )
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(a, b.astype(jnp.bfloat16)),
        loaded,
        params,
    )


class TensorStoreFixtureTest(parameterized.TestCase):

  def _toy_state_from_chunks(self):
    """tiny_t5's state, decoded from its gzip chunks with numpy."""
    root = os.path.join(TESTDATA, "tiny_t5", "checkpoint_1")
    state = {}
    for name, (dtype, shape) in TOY_STATE.items():
      directory = os.path.join(root, "state." + name.replace("/", "."))
      chunk = ".".join(["0"] * len(shape)) or "0"
      state[name] = _gunzip_chunk(directory, chunk, dtype, shape)
    return state

  def test_tiny_t5_state(self):
    state = t5x.read_tree(
        os.path.join(TESTDATA, "tiny_t5", "checkpoint_1"), part="state"
    )
    flat = _flat(state)
    self.assertEqual(int(flat.pop("step")), 1)  # Inline, not tensorstore.
    expected = self._toy_state_from_chunks()
    self.assertSameElements(flat, expected)
    for name, array in flat.items():
      self.assertEqual(array.dtype, expected[name].dtype, name)
      np.testing.assert_array_equal(array, expected[name], name)

  def test_tiny_orbax_state(self):
    root = os.path.join(TESTDATA, "tiny_orbax", "1")
    expected = self._toy_state_from_chunks()
    # The Orbax fixture holds the same toy state: its raw zstd blocks are the
    # gzip-decoded bytes of tiny_t5.
    for name in ("param_states/kernel", "param_states/step"):
      block = _zstd_raw_block(
          os.path.join(
              root,
              "_optimizer.state." + name.replace("/", "."),
              ".".join(["0"] * expected[name].ndim) or "0",
          )
      )
      self.assertEqual(block, expected[name].tobytes())
    assumed = {
        name: jax.ShapeDtypeStruct(shape, dtype)
        for name, (dtype, shape) in TOY_STATE.items()
    }
    assumed["step"] = jax.ShapeDtypeStruct((), np.int32)
    flat = _flat(t5x.read_tree(root, part="state", assumed=assumed))
    self.assertEqual(int(flat.pop("step")), 1)
    for name, array in flat.items():
      self.assertEqual(array.dtype, expected[name].dtype, name)
      np.testing.assert_array_equal(array, expected[name], name)

  def test_tiny_orbax_without_shapes_names_missing_metadata(self):
    with self.assertRaisesRegex(
        checkpoints.CheckpointFormatError, r"_optimizer\.state\..*\.zarray"
    ):
      t5x.read_tree(os.path.join(TESTDATA, "tiny_orbax", "1"), part="state")

  def test_gcs_locations(self):
    directory = "gs://bucket/models/checkpoint_1"
    spec = {
        "driver": "zarr",
        "dtype": "float32",
        "kvstore": {
            "driver": "gcs",
            "bucket": "t5x-dummy-bucket",
            "path": "target.encoder.encoder_norm.scale",
        },
        "metadata": {"shape": [8], "chunks": [8], "compressor": {"id": "gzip"}},
    }
    self.assertEqual(
        tensorstore_leaf.StoredArray.from_spec(directory, spec).kvstore,
        {
            "driver": "gcs",
            "bucket": "bucket",
            "path": "models/checkpoint_1/target.encoder.encoder_norm.scale/",
        },
    )
    self.assertEqual(
        tensorstore_leaf.StoredArray.from_placeholder(
            directory, "PLACEHOLDER://target.x.kernel"
        ).kvstore,
        {
            "driver": "gcs",
            "bucket": "bucket",
            "path": "models/checkpoint_1/target.x.kernel/",
        },
    )
    self.assertEqual(
        storage.kvstore_spec("gs://bucket", "checkpoint"),
        {"driver": "gcs", "bucket": "bucket", "path": "checkpoint"},
    )
    self.assertEqual(
        storage.kvstore_spec("gs://bucket/models/checkpoint_1/", "checkpoint"),
        {
            "driver": "gcs",
            "bucket": "bucket",
            "path": "models/checkpoint_1/checkpoint",
        },
    )

  def test_kvstore_file_streams_like_a_local_file(self):
    # gs:// files are read through this reader with a 'gcs' driver.
    spec = storage.kvstore_spec(TESTDATA, "test_t5_tiny.checkpoint_0")
    with open(TINY_CHECKPOINT, "rb") as f:
      data = f.read()
    with storage.open_kvstore_file(spec) as f:
      self.assertEqual(f.read(1000), data[:1000])
      self.assertEqual(f.read(), data[1000:])
      self.assertEqual(f.read(10), b"")
    with storage.open_kvstore_file(spec) as f:
      tree = msgpack_tree.TreeReader(f)
      self.assertEqual(list(tree.keys())[:1], ["version"])


if __name__ == "__main__":
  absltest.main()
