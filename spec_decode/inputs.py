"""A run's inputs: text from a file, a seqio task or one prompt, as int32 batches.

Exactly one source is configured:

  read_inputs.path = 'inputs.txt'        # one input per line
  read_inputs.task = 'multi30k_en_de'     # a registered seqio task's inputs
  read_inputs.prompt = 'translate English to German: A dog runs.'

Inputs are tokenized with the run's vocabulary, end with EOS as in T5, and are
padded with 0 to `max_input_len`. An input that does not fit is an error, or is
cut (and counted) when `truncate` is set.
"""

import dataclasses
import gzip
import pathlib

from absl import logging
import gin
import numpy as np

from spec_decode import checks

# T5's end of sequence.
EOS_ID = 1


@gin.configurable
def read_inputs(
    path=None,
    task=None,
    prompt=None,
    prefix="",
    split="test",
    num_examples=None,
):
  """Reads the run's input texts.

  Args:
    path: a text file with one input per line.
    task: the name of a registered seqio task; its pretokenized 'inputs'.
    prompt: a single input.
    prefix: prepended to each input from `path` or `prompt`, e.g.
      'translate English to German: '.
    split: the task's split.
    num_examples: keep the first this many inputs (None: all).

  Returns:
    A list of strings.

  Raises:
    ValueError: if not exactly one source is set, the prefix is no string,
      num_examples is not None or an int >= 1, or there are no inputs.
  """
  if not isinstance(prefix, str):
    raise ValueError(f"read_inputs.prefix must be a string, got {prefix!r}")
  if num_examples is not None and not (
      checks.is_int(num_examples) and num_examples >= 1
  ):
    # A -1 would take every example of a task and then drop the last.
    raise ValueError(
        "read_inputs.num_examples must be an int >= 1, or None for all "
        f"inputs, got {num_examples!r}"
    )
  sources = {"path": path, "task": task, "prompt": prompt}
  chosen = [name for name, value in sources.items() if value is not None]
  if len(chosen) != 1:
    raise ValueError(
        "read_inputs: set exactly one of read_inputs.path, read_inputs.task "
        f"and read_inputs.prompt (got {chosen or 'none'})"
    )
  if path is not None:
    texts = [
        prefix + line
        for line in read_text(path, "read_inputs.path").splitlines()
        if line.strip()
    ]
    where = f"input file {path}"
  elif prompt is not None:
    texts = [prefix + prompt] if prompt.strip() else []
    where = "read_inputs.prompt"
  else:
    texts = _task_inputs(task, split, num_examples)
    where = f"seqio task {task} ({split})"
  texts = texts[:num_examples]
  if not texts:
    raise ValueError(f"no inputs: {where} is empty")
  return texts


def read_text(path, what):
  """A UTF-8 text file's contents, or a one-line error naming it.

  A name ending in .gz is read through gzip.

  Args:
    path: the file.
    what: what the file is, for the message (e.g. 'run.ngram_corpus').

  Returns:
    The text.

  Raises:
    ValueError: if there is no such file, or it is not UTF-8.
  """
  file = pathlib.Path(path)
  if not file.is_file():
    raise ValueError(f"{what}: no such file: {path}")
  try:
    if file.suffix == ".gz":
      return gzip.decompress(file.read_bytes()).decode("utf-8")
    return file.read_text(encoding="utf-8")
  except (gzip.BadGzipFile, EOFError) as e:
    raise ValueError(f"{what}: {path} is not a gzip file ({e})") from None
  except UnicodeDecodeError as e:
    raise ValueError(
        f"{what}: {path} is not UTF-8 text (byte {e.start}: "
        f"{e.object[e.start:e.start + 1]!r}); convert it, e.g. with iconv"
    ) from None


def _quietly(function):
  """Calls function() with absl's warnings off (TFDS warns of its probes)."""
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  try:
    return function()
  finally:
    logging.set_verbosity(verbosity)


def _task_inputs(task_name, split, num_examples):
  import seqio  # pylint: disable=g-import-not-at-top  (imports TensorFlow)

  task = seqio.get_mixture_or_task(task_name)
  if isinstance(task.source, seqio.TfdsDataSource):
    # Else TFDS starts downloading and preparing it, which fails offline
    # after minutes of retries.
    builder = task.source.tfds_dataset.builder
    if not _quietly(builder.is_prepared):
      name = task.source.tfds_dataset.name
      raise ValueError(
          f"seqio task {task_name} reads the TFDS dataset {name}, which is "
          f"not prepared in {builder.data_dir}: prepare it with `tfds build "
          f"{name.split(':')[0]}` (needs the network; TFDS_DATA_DIR may point "
          "at a copy), or give the inputs as a file with read_inputs.path"
      )
  dataset = task.get_dataset(
      sequence_length=None, split=split, shuffle=False, num_epochs=1
  )
  if num_examples is not None:
    dataset = dataset.take(num_examples)
  return [
      ex["inputs_pretokenized"].decode() for ex in dataset.as_numpy_iterator()
  ]


@dataclasses.dataclass(frozen=True)
class EncodedInputs:
  """Tokenized inputs.

  Attributes:
    tokens: int32 [N, max_input_len], ending in EOS, 0-padded.
    num_truncated: how many inputs were cut to fit.
  """

  tokens: np.ndarray
  num_truncated: int


def encode(texts, vocabulary, max_input_len, truncate=False):
  """Tokenizes texts into one padded int32 array.

  Args:
    texts: N strings.
    vocabulary: a seqio.Vocabulary.
    max_input_len: the encoder's length, EOS included.
    truncate: cut inputs that do not fit (else they are an error).

  Returns:
    EncodedInputs.

  Raises:
    ValueError: if an input is too long and `truncate` is off.
  """
  tokens = np.zeros((len(texts), max_input_len), np.int32)
  num_truncated = 0
  for i, text in enumerate(texts):
    ids = list(vocabulary.encode(text)) + [EOS_ID]
    if len(ids) > max_input_len:
      if not truncate:
        raise ValueError(
            f"input {i + 1} has {len(ids)} tokens (EOS included), more than "
            f"max_input_len={max_input_len}; raise it or set "
            "run.truncate_inputs = True"
        )
      ids = ids[: max_input_len - 1] + [EOS_ID]
      num_truncated += 1
    tokens[i, : len(ids)] = ids
  return EncodedInputs(tokens, num_truncated)


def batches(tokens, batch_size):
  """Splits [N, S] tokens into [batch_size, S] batches, padding the last.

  The last batch is filled with copies of its first row so that every batch
  has one shape (one compilation).

  Args:
    tokens: int32 [N, S].
    batch_size: rows per batch.

  Yields:
    (batch int32 [batch_size, S], number of real rows in it).
  """
  for start in range(0, len(tokens), batch_size):
    batch = tokens[start : start + batch_size]
    num_real = len(batch)
    if num_real < batch_size:
      filler = np.repeat(batch[:1], batch_size - num_real, axis=0)
      batch = np.concatenate([batch, filler])
    yield batch, num_real


def octave(length):
  """The least power of two >= `length` (>= 1): the caches' key counts."""
  return 1 << (length - 1).bit_length()


def padded_length(longest):
  """The least 2^k or 3 * 2^(k-1) that holds `longest`: at most half again."""
  power = octave(longest)
  three_quarters = 3 * power // 4
  return three_quarters if power >= 4 and three_quarters >= longest else power


def trim(batch, minimum=8):
  """Drops the padding columns every row has, to a length in 1.5x steps.

  The encoder then runs on about the batch's own length rather than
  max_input_len: lengths 8, 12, 16, 24, 32, 48, 64, ... pad it by at most
  half the longest row. Powers of two had padded the demo's 100 test
  inputs (23.5 tokens on average) to 32.6 columns, these pad them to 26.9:
  on a 2-core Zen 3 EPYC the demo's set-up took 12.9 ms a sentence against
  15.1 (medians of four runs each, in turn; README, "A twelfth session").
  The caches hold the least power of two of keys >= S'
  (`drafts.keys_in_octaves`), so the decode loops compile once an octave.

  Args:
    batch: int32 [B, S] tokens, 0 for padding.
    minimum: the shortest length kept.

  Returns:
    int32 [B, S'], S' = min(S, `padded_length` of the longest row and
    `minimum`).
  """
  longest = max(int(np.max(np.sum(batch > 0, axis=1))), minimum)
  return batch[:, : min(batch.shape[1], padded_length(longest))]


def run_config_batches(num_inputs, batch_size, max_input_len=512):
  """The run config's first inputs (`read_inputs` as gin binds it), encoded
  with its vocabulary, as trimmed int32 [B, S] batches: what a run decodes.
  For benchmarks that time the decoders on a run's own sentences."""
  # pylint: disable-next=g-import-not-at-top (seqio, TensorFlow)
  from spec_decode import vocabulary

  texts = read_inputs()[:num_inputs]
  encoded = encode(
      texts, vocabulary.bound_for_run(), max_input_len, truncate=True
  )
  return [trim(batch) for batch, _ in batches(encoded.tokens, batch_size)]
