"""spec_decode.checkpoints.load_params beyond the T5X format: Orbax PyTree
step directories, one-line errors for checkpoints it cannot load (Mesh
TensorFlow, missing, unknown, truncated, not fitting the model), and the host
memory a load takes. The T5X format's own tests are in t5x_checkpoint_test.py.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
from flax import traverse_util
import jax
import numpy as np
import orbax.checkpoint as ocp

import checkpoint_fixtures
from checkpoint_fixtures import SMALL, TESTDATA, TINY, TINY_CHECKPOINT
from spec_decode import checkpoints
from spec_decode.models import t5

_MEMORY_WORKER = os.path.join(
    os.path.dirname(__file__), "host_memory_worker.py"
)
_flat = checkpoint_fixtures.flat
_small_params = checkpoint_fixtures.small_params
_tempdir = checkpoint_fixtures.tempdir
_write_msgpack = checkpoint_fixtures.write_msgpack


class OrbaxPyTreeTest(absltest.TestCase):

  def test_t5x_orbax_step_directory(self):
    params = _small_params()
    step_dir = os.path.join(_tempdir(self), "checkpoint_1")
    ocp.PyTreeCheckpointer().save(
        os.path.join(step_dir, "state"),
        {"target": params, "state": {"step": np.array(1, np.int32)}},
    )
    self.assertEqual(
        checkpoints.detect_format(step_dir), checkpoints.Format.ORBAX
    )
    loaded = checkpoints.load_params(step_dir, t5.param_shapes(SMALL))
    jax.tree.map(np.testing.assert_array_equal, loaded, params)


class ErrorsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("directory", ""),
      ("checkpoint_file", "checkpoint"),
      ("prefix", "model.ckpt-0"),
      ("index", "model.ckpt-0.index"),
  )
  def test_mesh_tensorflow_is_refused(self, name):
    path = os.path.join(TESTDATA, "mtf_tiny_t5", name)
    self.assertEqual(
        checkpoints.detect_format(path), checkpoints.Format.MESH_TENSORFLOW
    )
    with self.assertRaises(checkpoints.CheckpointFormatError) as raised:
      checkpoints.load_params(path, t5.param_shapes(TINY))
    message = str(raised.exception)
    self.assertIn("is a Mesh TensorFlow checkpoint", message)
    self.assertIn("t5x.scripts.convert_tf_checkpoint", message)
    self.assertNotIn("\n", message)

  def test_missing_path(self):
    with self.assertRaisesRegex(
        checkpoints.CheckpointFormatError, "does not exist"
    ):
      checkpoints.load_params("/no/such/checkpoint", t5.param_shapes(TINY))

  def test_unknown_formats(self):
    directory = _tempdir(self)
    text = os.path.join(directory, "notes.txt")
    with open(text, "w") as f:
      f.write("hello")
    with self.assertRaisesRegex(
        checkpoints.CheckpointFormatError, "No checkpoint found in directory"
    ):
      checkpoints.load_params(directory, t5.param_shapes(TINY))
    with self.assertRaisesRegex(
        checkpoints.CheckpointFormatError, "Unknown checkpoint format"
    ):
      checkpoints.load_params(text, t5.param_shapes(TINY))

  def test_truncated_msgpack(self):
    with open(TINY_CHECKPOINT, "rb") as f:
      head = f.read(100_000)
    path = os.path.join(_tempdir(self), "checkpoint")
    with open(path, "wb") as f:
      f.write(head)
    with self.assertRaisesRegex(
        checkpoints.CheckpointFormatError, "is not a T5X msgpack checkpoint"
    ):
      checkpoints.load_params(path, t5.param_shapes(TINY))

  def test_mismatch_lists_every_difference(self):
    params = _flat(_small_params())
    del params["encoder/encoder_norm/scale"]
    params["encoder/extra/kernel"] = np.zeros((2, 3), np.float32)
    params["decoder/layers_0/mlp/wo/kernel"] = np.zeros((4, 8), np.float32)
    path = _write_msgpack(
        _tempdir(self),
        {
            "version": 3,
            "optimizer": {
                "target": traverse_util.unflatten_dict(params, sep="/")
            },
        },
    )
    with self.assertRaises(checkpoints.CheckpointMismatchError) as raised:
      checkpoints.load_params(path, t5.param_shapes(SMALL))
    message = str(raised.exception)
    self.assertIn("missing: encoder/encoder_norm/scale [8]", message)
    self.assertIn("unexpected: encoder/extra/kernel [2, 3]", message)
    self.assertIn(
        "wrong shape: decoder/layers_0/mlp/wo/kernel is [4, 8] in "
        "the checkpoint, the model expects [16, 8]",
        message,
    )
    self.assertNotIn("vocabulary", message)

  def test_vocab_mismatch_is_named(self):
    config = dataclasses.replace(TINY, vocab_size=32000)
    with self.assertRaises(checkpoints.CheckpointMismatchError) as raised:
      checkpoints.load_params(TINY_CHECKPOINT, t5.param_shapes(config))
    message = str(raised.exception)
    self.assertIn(
        "vocabulary size mismatch: the checkpoint has 32128 tokens, "
        "the model expects 32000",
        message,
    )
    self.assertIn(
        "wrong shape: decoder/logits_dense/kernel is [8, 32128]", message
    )


class HostMemoryTest(absltest.TestCase):
  """ "Never more than one full copy on the host", measured.

  A 1.17 GB T5X checkpoint of random float32 weights (50 tensors, the
  largest 132 MB; see host_memory_worker.py) is written by one process and
  loaded by another, which reports its resident set size before the load
  and its peak during it. The load may hold one full copy of the parameters
  plus transient copies of the one being read: msgpack's read buffer (which
  may double as it grows), the extension object's bytes, the array's bytes
  inside it, and the cast copy, at most 5 times the largest parameter. A
  loader that held the whole file, or every parameter twice, would need
  about twice the total.
  """

  def _worker(self, *args):
    env = dict(os.environ)
    tests = os.path.dirname(os.path.abspath(__file__))
    # This checkout's spec_decode, not an installed one.
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [os.path.dirname(tests), tests, env.get("PYTHONPATH")])
    )
    return subprocess.run(
        [sys.executable, _MEMORY_WORKER, *args],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout

  def test_peak_host_memory_is_one_copy_of_the_parameters(self):
    # RAM-backed when possible: the file's pages are not the loader's.
    parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = tempfile.mkdtemp(dir=parent)
    self.addCleanup(shutil.rmtree, directory)
    self._worker("write", directory)
    figures = json.loads(self._worker("load", directory).splitlines()[-1])
    self.assertGreater(figures["total"], 2**30)
    self.assertLessEqual(
        figures["peak"] - figures["rss_before"],
        figures["total"] + 5 * figures["largest"],
        figures,
    )


if __name__ == "__main__":
  absltest.main()
