"""Checkpoint integrity: exports record checksums, and a changed or corrupt
array, or a NaN / inf parameter in any format, refuses to load."""

import json
import pathlib
import tempfile

from absl.testing import absltest
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

import run_test
import tiny_pair
from spec_decode import checkpoints
from spec_decode import partitioning
from spec_decode import train_checkpoints
from spec_decode.models import t5

_save_t5x = run_test._save_t5x_checkpoint  # pylint: disable=protected-access
_DRAFT = tiny_pair.DRAFT


class CheckpointIntegrityTest(absltest.TestCase):
  """Checksums of exports, and NaN / inf in any format, refuse to load."""

  def setUp(self):
    super().setUp()
    self.tmp = pathlib.Path(tempfile.mkdtemp())
    self.params = t5.init_params(_DRAFT, jax.random.key(0))
    self.shapes = t5.param_shapes(_DRAFT)

  def _export(self, params=None):
    directory = self.tmp / "export"
    train_checkpoints.export_params(
        self.params if params is None else params, directory, jnp.bfloat16
    )
    return directory

  def test_export_records_checksums_and_loads(self):
    directory = self._export()
    sums = json.loads((directory / "checksums.json").read_text())
    flat = traverse_util.flatten_dict(self.params, sep="/")
    self.assertEqual(set(sums), set(flat))
    loaded = checkpoints.load_params(str(directory), self.shapes, jnp.float32)
    name = "decoder/logits_dense/kernel"
    np.testing.assert_array_equal(
        traverse_util.flatten_dict(loaded, sep="/")[name],
        np.asarray(flat[name].astype(jnp.bfloat16), np.float32),
    )

  def test_changed_array_fails_its_checksum(self):
    directory = self._export()
    sums_file = directory / "checksums.json"
    sums = json.loads(sums_file.read_text())
    # As if the stored bytes had changed: the record no longer matches them.
    sums["encoder/layers_0/mlp/wo/kernel"]["sha256"] = "0" * 64
    sums_file.write_text(json.dumps(sums))
    mesh = partitioning.make_mesh(num_devices=2)
    for shardings in (
        None,  # Read whole.
        partitioning.shardings(
            self.shapes, t5.param_logical_axes(_DRAFT), mesh
        ),  # Read shard by shard, as runs do.
    ):
      with self.assertRaisesRegex(
          checkpoints.CheckpointError,
          r"^.*/export: parameter encoder/layers_0/mlp/wo/kernel does not "
          r"match its checksum in checksums.json",
      ):
        checkpoints.load_params(
            str(directory), self.shapes, jnp.float32, shardings
        )

  def test_random_bytes_over_a_data_file_fail(self):
    directory = self._export()
    # Random bytes over the middle half of every data file (the process's
    # and the merged manifest's, which may hold small values inline):
    # whatever tensorstore then decodes, or fails to, must not load.
    rng = np.random.default_rng(0)
    for data in sorted(p for p in directory.rglob("d/*") if p.is_file()):
      size = data.stat().st_size
      with open(data, "r+b") as f:
        f.seek(size // 4)
        f.write(rng.bytes(size // 2))
    with self.assertRaises(checkpoints.CheckpointError) as raised:
      checkpoints.load_params(str(directory), self.shapes, jnp.float32)
    self.assertNotIn("\n", str(raised.exception))
    self.assertIn(str(directory), str(raised.exception))

  def test_nan_parameter_is_named_in_every_format(self):
    flat = traverse_util.flatten_dict(self.params, sep="/")
    name = "encoder/layers_0/attention/query/kernel"
    flat[name] = flat[name].at[0, 1].set(jnp.nan).at[1, 2].set(jnp.inf)
    broken = traverse_util.unflatten_dict(flat, sep="/")
    _save_t5x(jax.device_get(broken), self.tmp / "t5x")
    # An export records the NaN in its checksum; the value check refuses it.
    for directory in (self.tmp / "t5x", self._export(broken)):
      with self.assertRaisesRegex(
          checkpoints.CheckpointError,
          f"parameter {name} holds 2 NaN or infinite values of "
          f"{flat[name].size}",
      ):
        checkpoints.load_params(str(directory), self.shapes, jnp.float32)

  def test_shipped_demo_models_have_checksums(self):
    demo = pathlib.Path(__file__).resolve().parent.parent / "spec_decode/demo"
    for name in ("target", "draft", "draft_distilled"):
      self.assertTrue((demo / name / "checksums.json").is_file(), name)


if __name__ == "__main__":
  absltest.main()
