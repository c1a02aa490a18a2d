r"""The paper's Table 3 for the demo target: alpha of every draft, in minutes.

  python benchmarks/table3.py --gin_file=configs/demo.gin \
      --output=benchmarks/results/table3.json

For each dataset (Multi30k test_2016 and WMT21 newstest, first
--num_examples inputs) and temperature (0 and 1), the target of the gin
files samples its outputs once, and every draft of DRAFTS is
scored on them teacher-forced (`spec_decode.alpha`): alpha = E[beta], with
its standard error over sentences. No speculative loop runs. Prints a
markdown table (drafts by dataset and temperature) and writes the JSON.
"""

import json

from absl import flags
import jax
import numpy as np

from spec_decode import cli
from spec_decode import compare
from spec_decode import engine
from spec_decode import gin_config
from spec_decode import inputs as inputs_lib
from spec_decode import lookup
from spec_decode import pair
from spec_decode import partitioning
from spec_decode import sampling
from spec_decode import teacher_forced

_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 1000, "Inputs per set.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Rows per call.")
_DRAFTS = flags.DEFINE_list(
    "drafts", None, "Names of DRAFTS to score (default all); --t5_drafts add."
)
_OUTPUT = flags.DEFINE_string("output", None, "Write the results JSON here.")
_T5_DRAFTS = flags.DEFINE_list(
    "t5_drafts",
    [],
    "More T5 drafts to score beside DRAFTS, each NAME=SIZE_FILE:CHECKPOINT "
    "(SIZE_FILE under configs/, e.g. models/demo_draft.gin).",
)

# name: (kind, size file under configs/ or None, checkpoint or n-gram corpus)
DRAFTS = {
    "t5_1.9m": ("t5", "models/demo_draft.gin", "spec_decode/demo/draft"),
    "t5_1.9m_distilled": (
        "t5",
        "models/demo_draft.gin",
        "spec_decode/demo/draft_distilled_48m",
    ),
    "t5_1.9m_distillspec": (
        "t5",
        "models/demo_draft.gin",
        "spec_decode/demo/draft_distillspec_48m",
    ),
    "t5_1.4m_shared_encoder": (
        "t5",
        "models/demo_draft_shared.gin",
        "spec_decode/demo/draft_shared_48m",
    ),
    "t5_1.4m_shared_encoder_greedy": (
        "t5",
        "models/demo_draft_shared.gin",
        "spec_decode/demo/draft_shared_greedy_48m",
    ),
    "t5_1.8m_shared_encoder_2l_greedy": (
        "t5",
        "models/demo_draft_shared_2l.gin",
        "spec_decode/demo/draft_shared2_greedy_48m",
    ),
    "t5_1.9m_distilled_9.2m": (
        "t5",
        "models/demo_draft.gin",
        "spec_decode/demo/draft_distilled",
    ),
    "t5_9.2m": ("t5", "models/demo_target.gin", "spec_decode/demo/target"),
    "bigram": ("bigram", None, "spec_decode/demo/multi30k/train.de.gz"),
    "unigram": ("unigram", None, "spec_decode/demo/multi30k/train.de.gz"),
    "lookup": ("lookup", None, None),
}
# name: the gin bindings that select its inputs.
DATASETS = {
    "multi30k": ["read_inputs.task = 'multi30k_en_de'"],
    # News sentences are longer: the first 1,000 fit 192 tokens but for a
    # few (`num_truncated` counts them).
    "wmt21": ["read_inputs.task = 'wmt21_en_de'", "run.max_input_len = 192"],
}
TEMPERATURES = (0.0, 1.0)


def _parse(bindings=()):
  """The run's gin files and bindings, then `bindings`."""
  gin_config.parse(
      cli.GIN_FILES.value, list(cli.GIN_BINDINGS.value) + list(bindings)
  )


def _all_drafts():
  """DRAFTS and those of --t5_drafts."""
  table = dict(DRAFTS)
  for entry in _T5_DRAFTS.value:
    name, _, rest = entry.partition("=")
    size_file, _, path = rest.partition(":")
    if not (name and size_file and path):
      raise ValueError(
          f"--t5_drafts entry {entry!r} is not NAME=SIZE_FILE:CHECKPOINT"
      )
    table[name] = ("t5", size_file, path)
  return table


def _draft(spec, target, vocab, mesh):
  """(model, params) of a DRAFTS entry (model None for a draft with none)."""
  kind, size_file, path = spec
  if kind == "lookup":
    return None, lookup.PromptLookup(target.config.vocab_size)
  if kind != "t5":
    ngram = compare.ngram_params(kind, path, vocab, target.config.vocab_size)
    return None, engine.place_ngram(ngram, mesh)
  _parse(
      [f"include 'draft:{size_file}'", f"draft/checkpoint_path.path = '{path}'"]
  )
  draft = pair.load_model("draft", mesh)
  return draft.model, draft.params


def _markdown(results, names):
  columns = [(d, t) for d in DATASETS for t in TEMPERATURES]
  lines = [
      "| draft | " + " | ".join(f"{d}, T={t:g}" for d, t in columns) + " |",
      "|---|" + "---:|" * len(columns),
  ]
  for name in names:
    cells = [
        "{alpha:.3f} ± {standard_error:.3f}".format(**results[d][str(t)][name])
        for d, t in columns
    ]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main(argv):
  with cli.one_line_errors():
    _main(argv)


def _main(argv):
  cli.start(argv)
  # pylint: disable-next=g-import-not-at-top
  from spec_decode import vocabulary  # Imports TensorFlow, after cli.start.

  table = _all_drafts()
  names = _names(table)
  mesh = partitioning.make_mesh()
  vocab = vocabulary.bound_for_run()
  max_decode_len = gin_config.gin.query_parameter("run.max_decode_len")
  target = pair.load_model("target", mesh)
  scorer = teacher_forced.Scorer(
      target.model,
      target.params,
      {name: _draft(table[name], target, vocab, mesh) for name in names},
      mesh,
  )
  decoders = engine.Engine(mesh, target.model, target.params)
  results = {
      dataset: _dataset_alphas(
          bindings, decoders, scorer, vocab, max_decode_len
      )
      for dataset, bindings in DATASETS.items()
  }
  markdown = _markdown(results, names)
  print(markdown)
  if _OUTPUT.value:
    _write(results, {n: table[n] for n in names}, markdown)


def _names(table):
  """The drafts to score: --drafts (or all of DRAFTS), then --t5_drafts'.

  Args:
    table: `_all_drafts`, name: (kind, size file, checkpoint or corpus).

  Returns:
    The names, each once, in that order.

  Raises:
    ValueError: a name of --drafts is in neither DRAFTS nor --t5_drafts.
  """
  extra = [name for name in table if name not in DRAFTS]
  names = list(dict.fromkeys((_DRAFTS.value or list(DRAFTS)) + extra))
  unknown = sorted(set(names) - set(table))
  if unknown:
    raise ValueError(f"--drafts: no draft named {', '.join(unknown)}")
  return names


def _dataset_alphas(bindings, decoders, scorer, vocab, max_decode_len):
  """Every draft's alpha on a dataset, at each of TEMPERATURES.

  Args:
    bindings: the gin bindings that select the dataset's inputs (DATASETS).
    decoders: the target's `engine.Engine`, which samples the outputs.
    scorer: the `teacher_forced.Scorer` of the target and every draft.
    vocab: the run's vocabulary.
    max_decode_len: tokens sampled per row.

  Returns:
    {"num_truncated": inputs cut to run.max_input_len, str(temperature):
    {draft name: `teacher_forced.estimate`'s fields, "mean_output_len": ...}}.
  """
  _parse(bindings + [f"read_inputs.num_examples = {_NUM_EXAMPLES.value}"])
  encoded = inputs_lib.encode(
      inputs_lib.read_inputs(),
      vocab,
      gin_config.gin.query_parameter("run.max_input_len"),
      True,
  )
  results = {"num_truncated": encoded.num_truncated}
  for temperature in TEMPERATURES:
    _, betas, lengths = teacher_forced.betas_of(
        decoders,
        scorer,
        encoded.tokens,
        sampling.SamplingConfig(temperature),
        _BATCH_SIZE.value,
        max_decode_len,
    )
    results[str(temperature)] = {
        name: vars(teacher_forced.estimate(b, lengths, temperature))
        for name, b in betas.items()
    }
    results[str(temperature)]["mean_output_len"] = float(np.mean(lengths))
  return results


def _write(results, drafts, markdown):
  """Writes --output: the run's flags, device, drafts, results and table."""
  record = {
      "gin_files": cli.GIN_FILES.value,
      "gin_bindings": cli.GIN_BINDINGS.value,
      "num_examples": _NUM_EXAMPLES.value,
      "device": str(jax.devices()[0].device_kind),
      "drafts": drafts,
      "results": results,
      "markdown": markdown,
  }
  with open(_OUTPUT.value, "w") as f:
    f.write(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
  cli.run(main)
