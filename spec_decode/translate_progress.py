"""A translate run's finished batches, kept beside its --output to resume.

Translating a large file takes long (the demo target translated Multi30k's
29,000 training sources in 41 minutes on 2 CPU cores). Each finished
batch's outputs are appended to `<output>.progress.jsonl` as they come, so
Ctrl-C or a late failure loses at most the batch in flight, and the same
command resumes after the batches kept. The file's first line holds what
makes a batch's outputs what they are: the inputs' SHA-256, the batch size,
the lengths, the temperature, the seed and the gin config. A file from
another setting is an error, never mixed in. Batch i samples with
fold_in(seed, i), so a resumed run writes what a run never stopped writes.
The file is removed once the outputs are written.
"""

import hashlib
import json
import pathlib

from spec_decode import run_outputs

SUFFIX = ".progress.jsonl"


def setting(sources, batch_size, lengths, temperature, seed, config):
  """What a batch's outputs depend on, as the progress file records it.

  Args:
    sources: the input lines.
    batch_size: rows per decoder call.
    lengths: (max_input_len, max_decode_len).
    temperature: the sampling temperature (0 greedy).
    seed: the sampling seed.
    config: the gin config text (`gin.config_str()`).

  Returns:
    A JSON-able dict.
  """
  text = "\n".join(sources).encode("utf-8")
  return {
      "inputs_sha256": hashlib.sha256(text).hexdigest(),
      "num_inputs": len(sources),
      "batch_size": batch_size,
      "max_input_len": lengths[0],
      "max_decode_len": lengths[1],
      "temperature": temperature,
      "seed": seed,
      "gin_config_sha256": hashlib.sha256(config.encode("utf-8")).hexdigest(),
  }


class Progress:
  """The batches a run of `setting` finished, read from and added to `path`.

  Attributes:
    path: the progress file.
    done: batch index -> its outputs (in the batch's row order), for the
      batches finished before.
  """

  def __init__(self, path, run_setting):
    self.path = pathlib.Path(path)
    self.done = {}
    if self.path.exists():
      self._read(run_setting)
    else:
      run_outputs.write_atomically(self.path, json.dumps(run_setting) + "\n")
    self._file = open(self.path, "a", encoding="utf-8")

  def _read(self, run_setting):
    lines = self.path.read_text(encoding="utf-8").splitlines()
    recorded = json.loads(lines[0]) if lines else None
    if recorded != run_setting:
      differ = sorted(
          key
          for key in run_setting
          if not isinstance(recorded, dict)
          or recorded.get(key) != run_setting[key]
      )
      raise ValueError(
          f"{self.path} holds the batches of another setting (differing in "
          f"{', '.join(differ)}): remove it to start over"
      )
    for line in lines[1:]:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        break  # The last line, cut off as it was written: redo its batch.
      self.done[record["batch"]] = record["outputs"]

  def add(self, index, outputs):
    """Records batch `index`'s outputs, on disk before it returns."""
    self._file.write(json.dumps({"batch": index, "outputs": outputs}) + "\n")
    self._file.flush()
    self.done[index] = outputs

  def interrupted(self, num_batches):
    """What Ctrl-C kept: a message for the interrupted run."""
    self._file.close()
    return (
        f"after {len(self.done)} of {num_batches} batches; they are kept in "
        f"{self.path}, and the same command resumes after them"
    )

  def finish(self):
    """Removes the file: the outputs are written."""
    self._file.close()
    self.path.unlink()
