"""Without the network: an unprepared TFDS dataset, an unreachable gs://
checkpoint and TensorFlow's file errors each fail in one line, and the
Multi30k training text ships in the package."""

import io
import pathlib
import subprocess
import sys
from unittest import mock

from absl.testing import absltest

import tiny_pair
from spec_decode import checkpoints
from spec_decode import cli
from spec_decode import data
from spec_decode.models import t5

_DRAFT = tiny_pair.DRAFT


class OfflineTest(absltest.TestCase):
  """The paper's configs and the README's commands without the network."""

  def test_unprepared_tfds_dataset_is_one_line(self):
    # In a process of its own: a TFDS builder may start TensorFlow's GCS
    # file system (threads that outlive the test) looking for its files.
    script = """
from unittest import mock
import seqio
from spec_decode import data, inputs
builder = seqio.get_mixture_or_task("wmt_t2t_en_de").source.tfds_dataset
with mock.patch.object(type(builder.builder), "is_prepared", return_value=False):
  try:
    inputs.read_inputs(task="wmt_t2t_en_de")
  except ValueError as e:
    print(e)
"""
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=pathlib.Path(__file__).resolve().parent.parent,
    )
    # `data` registered the task, importing tensorflow_datasets, which needs
    # importlib_resources.
    self.assertRegex(
        result.stdout.splitlines()[0],
        r"^seqio task wmt_t2t_en_de reads the TFDS dataset "
        r"wmt_t2t_translate/de-en:1.0.0, which is not prepared in .*: "
        r"prepare it with `tfds build wmt_t2t_translate/de-en`",
    )

  def test_unreachable_gcs_fails_at_once(self):
    with mock.patch.object(
        checkpoints.socket, "getaddrinfo", side_effect=OSError(-2, "no DNS")
    ):
      with self.assertRaisesRegex(
          checkpoints.CheckpointError,
          r"^cannot read gs://b/ckpt: storage.googleapis.com does not "
          r"resolve \(no DNS\)",
      ):
        checkpoints.load_params("gs://b/ckpt", t5.param_shapes(_DRAFT))

  def test_tensorflow_file_errors_are_one_line(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    stderr = io.StringIO()
    with mock.patch.object(sys, "stderr", stderr):
      with self.assertRaises(SystemExit) as exited:
        with cli.one_line_errors():
          raise tf.errors.FailedPreconditionError(
              None, None, "Could not resolve host\n when reading gs://x/y"
          )
    self.assertEqual(exited.exception.code, 1)
    self.assertEqual(
        stderr.getvalue(),
        "error: Could not resolve host when reading gs://x/y\n",
    )

  def test_multi30k_training_text_ships_in_the_package(self):
    package = pathlib.Path(data.__file__).resolve().parent
    self.assertEqual(data.multi30k_dir(), package / "demo" / "multi30k")
    for split, size in (("train", 29_000), ("validation", 1_014)):
      sources, references = data.parallel_text(data.MULTI30K, split)
      self.assertLen(sources, size)
      self.assertLen(references, size)


if __name__ == "__main__":
  absltest.main()
