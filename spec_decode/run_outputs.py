"""What a run writes to its output_dir, so that no work is lost.

  results.json   the report (`compare.run`'s dict), written atomically
  outputs.jsonl  one line per input: both decoders' outputs, written as the
                 run goes, a batch at a time
  config.gin     the operative config, written atomically

The directory is checked for writing before any decoding, so that an
unwritable one costs nothing (`make_writable_dir`, which the Table 2 sweep
uses too); so is each file that the other CLIs write (`check_writable_file`).
"""

import contextlib
import json
import os
import pathlib
import tempfile

RESULTS_FILE = "results.json"
OUTPUTS_FILE = "outputs.jsonl"
CONFIG_FILE = "config.gin"


def make_writable_dir(path, setting):
  """Makes the directory at `path` (and its parents), and checks writing there.

  Args:
    path: where a run's outputs go.
    setting: its gin setting, for the message (e.g. 'run.output_dir').

  Returns:
    The directory, a pathlib.Path.

  Raises:
    ValueError: if it cannot be made or written.
  """
  directory = pathlib.Path(path)
  try:
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=directory):
      pass
  except OSError as e:
    raise ValueError(
        f"{setting} {path} is not writable: {e.strerror or e}"
    ) from None
  return directory


def check_writable_file(path, flag):
  """Fails now, not after the work, if the file at `path` cannot be written.

  Args:
    path: the file a CLI writes when it is done.
    flag: its flag, for the message (e.g. '--output').

  Raises:
    ValueError: if `path` is a directory, or its directory cannot be written.
  """
  file = pathlib.Path(path)
  if file.is_dir():
    raise ValueError(f"{flag} {path} is a directory")
  try:
    with tempfile.TemporaryFile(dir=file.parent):
      pass
  except OSError as e:
    raise ValueError(
        f"{flag} {path} cannot be written: {e.strerror}: {file.parent}"
    ) from None


class Writer:
  """Writes a run's files to its output_dir, losing no work.

  Created before any decoding, it checks that the directory is writable.
  outputs.jsonl is opened at the first batch (an earlier run's results.json
  is removed then, so that no stale one sits next to new outputs) and gets
  each batch's rows, flushed: an interrupted run keeps what it decoded.
  results.json and config.gin are written whole, atomically, at the end.
  """

  def __init__(self, output_dir):
    self.directory = make_writable_dir(output_dir, "run.output_dir")
    self.replaced = any(
        (self.directory / name).exists()
        for name in (RESULTS_FILE, OUTPUTS_FILE, CONFIG_FILE)
    )
    self._outputs = None
    self.num_rows = 0  # Written to outputs.jsonl so far.

  def add_rows(self, rows):
    """Appends rows to outputs.jsonl and flushes them to the OS."""
    if self._outputs is None:
      (self.directory / RESULTS_FILE).unlink(missing_ok=True)
      # pylint: disable-next=consider-using-with  (closed by finish)
      self._outputs = open(self.directory / OUTPUTS_FILE, "w", encoding="utf-8")
    for row in rows:
      self._outputs.write(json.dumps(row, ensure_ascii=False) + "\n")
      self.num_rows += 1
    self._outputs.flush()

  def interrupted(self, num_inputs):
    """Closes outputs.jsonl; says what an interrupted run kept, and where."""
    self.close()
    if not self.num_rows:
      return f"before the first batch ended; {self.directory} holds no outputs"
    return (
        f"after {self.num_rows} of {num_inputs} inputs; their outputs are in "
        f"{self.directory / OUTPUTS_FILE}"
    )

  def close(self):
    """Closes outputs.jsonl (when a run stops early)."""
    if self._outputs is not None:
      self._outputs.close()

  def finish(self, results, config_str):
    """Closes outputs.jsonl; writes results.json and config.gin atomically."""
    self.close()
    write_atomically(
        self.directory / RESULTS_FILE, json.dumps(results, indent=2) + "\n"
    )
    write_atomically(self.directory / CONFIG_FILE, config_str)

  def summary(self):
    """Where the results went, and whether earlier ones were replaced."""
    replaced = " (earlier results there replaced)" if self.replaced else ""
    return (
        f"results in {self.directory}/: {RESULTS_FILE}, {OUTPUTS_FILE}, "
        f"{CONFIG_FILE}{replaced}"
    )


@contextlib.contextmanager
def said_on_interrupt(writer, num_inputs):
  """Ctrl-C in the block closes `writer` and says what outputs.jsonl kept.

  Args:
    writer: the run's Writer (None off the first host: Ctrl-C passes).
    num_inputs: the run's inputs.

  Yields:
    Nothing.

  Raises:
    KeyboardInterrupt: with the rows written, of num_inputs, and where.
  """
  try:
    yield
  except KeyboardInterrupt:
    if writer is None:
      raise
    raise KeyboardInterrupt(writer.interrupted(num_inputs)) from None


def write_atomically(path, text):
  """Writes text to a temporary file beside `path`, then renames it."""
  descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name)
  try:
    with os.fdopen(descriptor, "w", encoding="utf-8") as f:
      f.write(text)
    os.chmod(temporary, 0o644)  # mkstemp's 0o600 would hide it from others.
    os.replace(temporary, path)
  except BaseException:
    pathlib.Path(temporary).unlink(missing_ok=True)
    raise
