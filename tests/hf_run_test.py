"""spec_decode.run on a Hugging Face pair given only as directories.

A T5 1.1 target and a smaller T5 1.1 draft, saved by transformers with the
checkpoint's spiece.model beside them, as a user downloads them. The run file
names the two directories and nothing of their sizes or vocabulary; the
greedy outputs of both decoders must equal transformers' `generate`.
"""

import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
import torch
import transformers

import hf_directories

_MAX_DECODE_LEN = 12
# The SentencePiece model's pieces and T5's 100 extra ids, every id decodable.
_VOCAB_SIZE = hf_directories.SPM_PIECES + 100
# Weights of T5's scale (not transformers' tiny initialization), so that
# greedy outputs differ from input to input.
_WEIGHT_STD = 0.5
_EOS_ID = 1
_REPO = pathlib.Path(__file__).resolve().parent.parent


class HfRunTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = pathlib.Path(tempfile.mkdtemp())
    target_dir, draft_dir = cls.tmp / "flan-t5-target", cls.tmp / "draft"
    spiece = hf_directories.train_spiece(cls.tmp / "spm")
    cls.target = hf_directories.save_model(
        "t5_1_1", target_dir, _VOCAB_SIZE, _WEIGHT_STD
    )
    # Logit 0 for the extra ids, far below the best piece's: the target, like
    # a trained model, writes no sentinels, which the vocabulary's decode
    # would drop from the text.
    with torch.no_grad():
      cls.target.lm_head.weight[hf_directories.SPM_PIECES :] = 0.0
    cls.target.save_pretrained(target_dir)
    hf_directories.save_model(
        "t5_1_1",
        draft_dir,
        _VOCAB_SIZE,
        _WEIGHT_STD,
        seed=1,
        d_model=8,
        d_ff=16,
        num_layers=1,
    )
    for directory in (target_dir, draft_dir):
      shutil.copy(spiece, directory)
    cls.tokenizer = transformers.T5Tokenizer.from_pretrained(str(target_dir))
    cls.inputs = hf_directories.sentences(6, seed=3)
    (cls.tmp / "inputs.txt").write_text("\n".join(cls.inputs) + "\n")
    cls.run_file = cls.tmp / "run.gin"
    cls.run_file.write_text(
        f"target/checkpoint_path.path = '{target_dir}'\n"
        f"draft/checkpoint_path.path = '{draft_dir}'\n"
        "run.gamma = 3\n"
        f"read_inputs.path = '{cls.tmp / 'inputs.txt'}'\n"
    )

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp)
    super().tearDownClass()

  def _generate(self, text):
    """transformers' greedy output ids for `text`, EOS and after cut off."""
    input_ids = torch.tensor([self.tokenizer(text).input_ids])
    with torch.no_grad():
      output = self.target.generate(
          input_ids,
          max_new_tokens=_MAX_DECODE_LEN,
          do_sample=False,
          num_beams=1,
          decoder_start_token_id=0,
          eos_token_id=_EOS_ID,
          pad_token_id=0,
      )[0, 1:].tolist()
    return output[: output.index(_EOS_ID) + 1] if _EOS_ID in output else output

  def test_directories_alone_match_transformers_generate(self):
    out = self.tmp / "results"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "spec_decode.run",
            f"--gin_file={self.run_file}",
            f"--gin_bindings=run.output_dir = '{out}'",
            f"--gin_bindings=run.max_decode_len = {_MAX_DECODE_LEN}",
            "--gin_bindings=run.batch_size = 2",
            "--gin_bindings=run.timing_repeats = 1",
            "--gin_bindings=run.progress = False",
            "--gin_bindings=make_mesh.num_devices = 1",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    rows = [
        json.loads(line)
        for line in (out / "outputs.jsonl").read_text().splitlines()
    ]
    results = json.loads((out / "results.json").read_text())
    self.assertEqual([row["input"] for row in rows], self.inputs)
    generated = [self._generate(text) for text in self.inputs]
    self.assertLess(max(max(ids) for ids in generated), _VOCAB_SIZE - 100)
    expected = [
        self.tokenizer.decode(ids, skip_special_tokens=True)
        for ids in generated
    ]
    self.assertGreater(len(set(expected)), 3)  # Outputs that differ.
    self.assertEqual([row["baseline"] for row in rows], expected)
    self.assertEqual([row["speculative"] for row in rows], expected)
    self.assertEqual(results["mismatches"], 0)
    self.assertEqual(
        results["baseline_tokens"], sum(len(ids) for ids in generated)
    )
    self.assertEqual(results["speculative_tokens"], results["baseline_tokens"])

    # The README's check, on the same run, and on a copy with one row
    # changed.
    self.assertEqual(
        self._check(out / "outputs.jsonl"),
        (0, "6 of 6 rows identical to transformers' generate"),
    )
    rows[2]["speculative"] += " x"
    changed = self.tmp / "changed.jsonl"
    changed.write_text("".join(json.dumps(row) + "\n" for row in rows))
    self.assertEqual(
        self._check(changed),
        (1, "5 of 6 rows identical to transformers' generate"),
    )

  def _check(self, outputs):
    """scripts/check_with_transformers.py's exit status and last line."""
    checked = subprocess.run(
        [
            sys.executable,
            str(_REPO / "scripts" / "check_with_transformers.py"),
            f"--checkpoint={self.tmp / 'flan-t5-target'}",
            f"--outputs={outputs}",
            f"--max_decode_len={_MAX_DECODE_LEN}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    self.assertIn(checked.returncode, (0, 1), checked.stderr)
    return checked.returncode, checked.stdout.splitlines()[-1]


if __name__ == "__main__":
  absltest.main()
