r"""Decodes a file of inputs with the target alone, and scores it with BLEU.

  python -m spec_decode.translate --gin_file=configs/demo.gin \
      --input=<English sentences, one a line, .gz allowed> --output=out.de \
      [--reference=<German references>] [--batch_size=64] \
      [--temperature=1 --seed=0]

The target under the run's target/ scope decodes alone (the baseline
decoder) at the run's max_input_len and max_decode_len, greedily or, with
--temperature, sampling (--seed); each input gets the task's prefix
('translate English to German: '). With --reference it prints corpus BLEU
(sacrebleu, 13a). It also writes the target outputs that
configs/train/multi30k_draft_distill.gin distills a draft from, and the
samples that configs/train/multi30k_draft_shared2_sampled.gin does.

With --output, each finished batch is kept in `<output>.progress.jsonl`
until the outputs are written: Ctrl-C or a failure loses at most the batch
in flight, and the same command resumes after the batches kept
(`translate_progress.py`).
"""

import pathlib
import sys

from absl import flags
import gin
import jax
import numpy as np
import tqdm

from spec_decode import cli
from spec_decode import compare  # pylint: disable=unused-import
from spec_decode import engine
from spec_decode import inputs as inputs_lib
from spec_decode import pair
from spec_decode import partitioning
from spec_decode import run_outputs
from spec_decode import sampling
from spec_decode import translate_progress

_INPUT = flags.DEFINE_string("input", None, "Source sentences.", required=True)
_OUTPUT = flags.DEFINE_string("output", None, "Where outputs go.")
_REFERENCE = flags.DEFINE_string("reference", None, "References, for BLEU.")
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 64, "Rows per call.", lower_bound=1
)
_TEMPERATURE = flags.DEFINE_float(
    "temperature", 0.0, "0 decodes greedily; above 0 samples at it."
)
flags.register_validator(
    "temperature", lambda value: value >= 0, "it must be a number >= 0"
)  # NaN too, which absl's lower_bound lets through.
_SEED = flags.DEFINE_integer("seed", 0, "The samples' random seed.")


def translate(
    sources,
    vocabulary,
    batch_size,
    max_input_len,
    max_decode_len,
    temperature=0.0,
    seed=0,
    progress=None,
):
  """The target's outputs for `sources` (longer inputs are truncated).

  Args:
    sources: N source sentences, without the task prefix.
    vocabulary: the seqio vocabulary.
    batch_size: rows per decoder call.
    max_input_len: the encoder's length.
    max_decode_len: most tokens per output.
    temperature: 0 for greedy outputs, else the sampling temperature.
    seed: the samples' seed; batch i samples with its i-th fold.
    progress: a `translate_progress.Progress`: its batches are not decoded
      again, and each batch decoded is added to it.

  Returns:
    N output strings.

  Raises:
    KeyboardInterrupt: on Ctrl-C, saying what `progress` kept.
  """
  from spec_decode import data  # pylint: disable=g-import-not-at-top

  texts = [data.translation_input(source) for source in sources]
  tokens = inputs_lib.encode(texts, vocabulary, max_input_len, True).tokens
  # Rows of similar lengths share a batch, so that few rows wait for the
  # batch's longest output.
  order = np.argsort(np.sum(tokens > 0, axis=1), kind="stable")
  mesh = partitioning.make_mesh()
  target = pair.load_model("target", mesh)
  decoders = engine.Engine(mesh, target.model, target.params)
  config = sampling.SamplingConfig(temperature=temperature)
  batches = list(inputs_lib.batches(tokens[order], batch_size))
  done = {} if progress is None else progress.done
  if done:
    print(
        f"resuming after {len(done)} of {len(batches)} batches",
        file=sys.stderr,
    )
  outputs = []
  try:
    for index, (batch, num_real) in enumerate(tqdm.tqdm(batches, unit="batch")):
      if index in done:
        outputs.extend(done[index])
        continue
      result = decoders.baseline(
          decoders.place_inputs(batch),
          jax.random.fold_in(jax.random.key(seed), index),
          max_decode_len=max_decode_len,
          config=config,
      )
      batch_outputs = _texts(result, num_real, vocabulary)
      if progress is not None:
        progress.add(index, batch_outputs)
      outputs.extend(batch_outputs)
  except KeyboardInterrupt:
    if progress is None:
      raise
    raise KeyboardInterrupt(progress.interrupted(len(batches))) from None
  restored = [""] * len(outputs)
  for position, index in enumerate(order):
    restored[index] = outputs[position]
  return restored


def _texts(result, num_real, vocabulary):
  """A batch's outputs, its first `num_real` rows, as text."""
  sequences, lengths = jax.device_get((result.sequences, result.lengths))
  outputs = []
  for row in range(num_real):
    ids = [int(i) for i in sequences[row, : lengths[row]]]
    if ids[-1:] == [inputs_lib.EOS_ID]:
      ids = ids[:-1]
    outputs.append(vocabulary.decode(ids))
  return outputs


def _lines(path, flag):
  return inputs_lib.read_text(path, flag).splitlines()


def main(argv):
  with cli.one_line_errors():
    cli.start(argv)
    # Every file is checked before the decoding, which can take long.
    if _OUTPUT.value:
      run_outputs.check_writable_file(_OUTPUT.value, "--output")
    sources = _lines(_INPUT.value, "--input")
    references = None
    if _REFERENCE.value:
      references = _lines(_REFERENCE.value, "--reference")
    # pylint: disable-next=g-import-not-at-top
    from spec_decode import vocabulary

    lengths = (
        gin.query_parameter("run.max_input_len"),
        gin.query_parameter("run.max_decode_len"),
    )
    progress = None
    if _OUTPUT.value:
      progress = translate_progress.Progress(
          _OUTPUT.value + translate_progress.SUFFIX,
          translate_progress.setting(
              sources,
              _BATCH_SIZE.value,
              lengths,
              _TEMPERATURE.value,
              _SEED.value,
              gin.config_str(),
          ),
      )
    outputs = translate(
        sources,
        vocabulary.bound_for_run(),
        _BATCH_SIZE.value,
        *lengths,
        _TEMPERATURE.value,
        _SEED.value,
        progress,
    )
    if progress is not None:
      run_outputs.write_atomically(
          pathlib.Path(_OUTPUT.value), "\n".join(outputs) + "\n"
      )
      progress.finish()
    if references is not None:
      from spec_decode import data  # pylint: disable=g-import-not-at-top

      score = data.bleu(references[: len(outputs)], outputs)["bleu"]
      print(f"BLEU {score:.2f} ({len(outputs)} sentences, sacrebleu 13a)")


if __name__ == "__main__":
  cli.run(main)
