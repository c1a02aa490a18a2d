"""Tests for spec_decode.translate: the demo target over a file, and BLEU."""

import gzip
import os
import pathlib
import subprocess
import sys
import tempfile

from absl.testing import absltest
import gin
import seqio

# Registers its gin configurables before gin_config.parse locks the config
# (translate() imports it lazily, after the parse).
from spec_decode import data  # pylint: disable=unused-import
from spec_decode import gin_config
from spec_decode import translate
from spec_decode import translate_progress
from spec_decode import vocabulary  # pylint: disable=unused-import

_REPO = pathlib.Path(__file__).resolve().parent.parent
_DEMO = _REPO / "spec_decode" / "demo"
_SOURCES = [
    "A man in an orange hat starring at something.",
    "Two dogs play in the snow.",
    "A group of people stand in front of an igloo.",
    "A boy jumps.",
    "A woman with a large purse is walking by a gate while a man in a blue "
    "shirt rides a bicycle down the street.",
    "Children are playing soccer on a field.",
]


def _vocabulary():
  return seqio.SentencePieceVocabulary(
      str(_DEMO / "sentencepiece.model"), extra_ids=96
  )


def _translate_cli(*flags):
  return subprocess.run(
      [
          sys.executable,
          "-m",
          "spec_decode.translate",
          "--gin_file=configs/demo.gin",
          *flags,
      ],
      capture_output=True,
      text=True,
      check=False,
      cwd=_REPO,
  )


class TranslateTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    os.chdir(_REPO)
    gin_config.parse([_REPO / "configs" / "demo.gin"])

  def tearDown(self):
    gin.clear_config()
    super().tearDown()

  def test_batched_outputs_are_in_input_order(self):
    # Batches of 4 sort the rows by length and pad the last batch; each
    # output must still be the one its input gets alone.
    batched = translate.translate(_SOURCES, _vocabulary(), 4, 64, 64)
    alone = [
        translate.translate([source], _vocabulary(), 1, 64, 64)[0]
        for source in _SOURCES
    ]
    self.assertEqual(batched, alone)
    self.assertLen(set(batched), len(_SOURCES))

  def test_samples_follow_the_seed(self):
    def sampled(temperature, seed):
      return translate.translate(
          _SOURCES, _vocabulary(), 4, 64, 64, temperature, seed
      )

    first = sampled(1.0, 0)
    self.assertEqual(sampled(1.0, 0), first)
    # At temperature 1 the demo target's samples differ from its greedy
    # outputs and from another seed's for some of the six sentences; a
    # temperature near 0 samples the argmax.
    greedy = translate.translate(_SOURCES, _vocabulary(), 4, 64, 64)
    self.assertNotEqual(first, greedy)
    self.assertNotEqual(sampled(1.0, 1), first)
    self.assertEqual(sampled(1e-4, 0), greedy)

  def test_cli_scores_bleu_against_references(self):
    tmp = pathlib.Path(tempfile.mkdtemp())
    with gzip.open(tmp / "inputs.en.gz", "wt") as f:
      f.write("\n".join(_SOURCES[:3]) + "\n")
    outputs = translate.translate(_SOURCES[:3], _vocabulary(), 8, 64, 64)
    (tmp / "refs.de").write_text("\n".join(outputs) + "\n")
    done = _translate_cli(
        f"--input={tmp / 'inputs.en.gz'}",
        f"--output={tmp / 'out.de'}",
        f"--reference={tmp / 'refs.de'}",
        "--batch_size=2",
    )
    self.assertEqual(done.returncode, 0, done.stderr[-2000:])
    self.assertIn("BLEU 100.00 (3 sentences", done.stdout)
    self.assertEqual((tmp / "out.de").read_text().splitlines(), outputs)
    # The batches kept for a resume go once the outputs are written.
    self.assertFalse((tmp / "out.de.progress.jsonl").exists())

  def test_an_interrupted_run_resumes_to_the_same_outputs(self):
    # Sampled, so that a resumed batch must sample with its own index's key.
    whole = translate.translate(_SOURCES, _vocabulary(), 2, 64, 64, 1.0, 5)
    path = pathlib.Path(tempfile.mkdtemp()) / "out.de.progress.jsonl"
    setting = translate_progress.setting(_SOURCES, 2, (64, 64), 1.0, 5, "")
    progress = translate_progress.Progress(path, setting)
    add = progress.add

    def add_then_stop(index, outputs):
      add(index, outputs)
      if len(progress.done) == 2:
        raise KeyboardInterrupt

    progress.add = add_then_stop
    with self.assertRaisesRegex(KeyboardInterrupt, "^after 2 of 3 batches"):
      translate.translate(_SOURCES, _vocabulary(), 2, 64, 64, 1.0, 5, progress)
    resumed = translate_progress.Progress(path, setting)
    self.assertEqual(sorted(resumed.done), [0, 1])
    decoded = []
    add_again = resumed.add
    resumed.add = lambda index, outputs: (
        decoded.append(index),
        add_again(index, outputs),
    )
    self.assertEqual(
        translate.translate(
            _SOURCES, _vocabulary(), 2, 64, 64, 1.0, 5, resumed
        ),
        whole,
    )
    self.assertEqual(decoded, [2])

  def test_cli_checks_every_file_before_decoding(self):
    tmp = pathlib.Path(tempfile.mkdtemp())
    (tmp / "inputs.en").write_text("\n".join(_SOURCES[:3]) + "\n")
    for flags, error in (
        (
            [f"--output={tmp / 'no_dir' / 'out.de'}"],
            f"error: --output {tmp / 'no_dir' / 'out.de'} cannot be written: "
            f"No such file or directory: {tmp / 'no_dir'}",
        ),
        (
            [f"--reference={tmp / 'refs.de'}"],
            f"error: --reference: no such file: {tmp / 'refs.de'}",
        ),
    ):
      with self.subTest(error=error):
        done = _translate_cli(f"--input={tmp / 'inputs.en'}", *flags)
        self.assertEqual(done.returncode, 1)
        # One line, and no progress bar: nothing was decoded.
        self.assertEqual(done.stderr.splitlines(), [error])
    # Batches kept by a run of another setting are not mixed in.
    stale = tmp / "stale.de.progress.jsonl"
    stale.write_text('{"seed": 9}\n{"batch": 0, "outputs": ["x"]}\n')
    done = _translate_cli(
        f"--input={tmp / 'inputs.en'}", f"--output={tmp / 'stale.de'}"
    )
    self.assertEqual(done.returncode, 1)
    self.assertRegex(
        done.stderr,
        f"^error: {stale} holds the batches of another setting \\(differing "
        "in batch_size, .*, temperature\\): remove it to start over\n$",
    )


if __name__ == "__main__":
  absltest.main()
