r"""Alpha of a draft for a target, with no speculative loop (the paper's Table 3).

  python -m spec_decode.alpha --gin_file=configs/demo.gin \
      [--temperatures=0,1] [--references=<file of outputs>] [--output=a.json]

For each temperature, the target's outputs for the run's inputs (sampled by
the baseline decoder at that temperature, with the run's top-k and top-p; or
the lines of --references, e.g. a test set's translations) are scored
teacher-forced by the target and by the draft, one forward pass each. At
every output position (its EOS included), beta = sum_x min(p(x), q(x)) is the
probability that the draft's token there is accepted (Corollary 3.6), p and q
being the two models' distributions after the same temperature, top-k and
top-p. Alpha is the mean of beta over positions; its standard error is
computed over sentences (positions of a sentence are not independent). It
prints alpha and the expected tokens per target call for gamma 1..8 (Eq. 1).
The logic is in `teacher_forced.py`. The draft is the run's: a T5 (draft/
scope), run.draft = 'unigram' or 'bigram' over run.ngram_corpus, or
run.draft = 'lookup' (prompt lookup).
"""

import functools
import math

from absl import flags
import gin

from spec_decode import alpha_report
from spec_decode import cli
from spec_decode import compare
from spec_decode import inputs as inputs_lib
from spec_decode import lookup
from spec_decode import pair
from spec_decode import run_outputs
from spec_decode import sampling
from spec_decode import teacher_forced

_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "Temperatures.")
_REFERENCES = flags.DEFINE_string(
    "references", None, "Score these outputs (one a line) instead of samples."
)
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 32, "Rows per call.", lower_bound=1
)
_OUTPUT = flags.DEFINE_string("output", None, "Write the results JSON here.")
_SEED = flags.DEFINE_integer("seed", 0, "Seeds the target's samples.")


def main(argv):
  with cli.one_line_errors():
    # Before the gin files, whose parsing imports seqio and TensorFlow
    # (seconds), and before the measurement, which can take long.
    temperatures = [_temperature(t) for t in _TEMPERATURES.value]
    if _OUTPUT.value:
      run_outputs.check_writable_file(_OUTPUT.value, "--output")
    cli.start(argv)
    # pylint: disable-next=g-import-not-at-top
    from spec_decode import vocabulary as vocabulary_lib

    vocabulary = vocabulary_lib.bound_for_run()
    max_decode_len = gin.query_parameter("run.max_decode_len")
    tokens = inputs_lib.encode(
        inputs_lib.read_inputs(),
        vocabulary,
        gin.query_parameter("run.max_input_len"),
        True,
    ).tokens
    references = _references(
        (
            inputs_lib.read_text(_REFERENCES.value, "--references").splitlines()
            if _REFERENCES.value
            else None
        ),
        len(tokens),
        vocabulary,
        max_decode_len,
    )
    model_free = _model_free_draft(vocabulary)
    configs = [
        sampling.SamplingConfig(
            t, _bound("run.top_k", 0), _bound("run.top_p", 1.0)
        )
        for t in temperatures
    ]
    estimates = alpha_report.kept_estimates(
        functools.partial(
            teacher_forced.measure,
            tokens,
            configs,
            _BATCH_SIZE.value,
            max_decode_len,
            references,
            _SEED.value,
            model_free,
        ),
        len(configs),
        _OUTPUT.value,
    )
    print(alpha_report.format_estimates(estimates))


def _temperature(text):
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not value >= 0:  # NaN too.
    raise ValueError(
        f"--temperatures: {text!r} is not a number >= 0 (e.g. "
        "--temperatures=0,1)"
    )
  return value


def _references(texts, num_inputs, vocabulary, max_decode_len):
  """--references' lines as output tokens for the inputs, or None."""
  if texts is None:
    return None
  if len(texts) < num_inputs:
    raise ValueError(
        f"--references has {len(texts)} lines, fewer than the "
        f"{num_inputs} inputs"
    )
  return teacher_forced.output_tokens(
      texts[:num_inputs], vocabulary, max_decode_len
  )


def _model_free_draft(vocabulary):
  """run.draft's lookup or n-gram draft; None for a T5 draft."""
  kind = _bound("run.draft", "t5")
  if kind == "lookup":
    return lookup.PromptLookup(pair.model_config("target").vocab_size)
  if kind in ("unigram", "bigram"):
    return compare.ngram_params(
        kind,
        _bound("run.ngram_corpus", None),
        vocabulary,
        pair.model_config("target").vocab_size,
    )
  if kind != "t5":
    raise ValueError(
        f"run.draft={kind!r}: spec_decode.alpha scores a 't5', 'unigram', "
        "'bigram' or 'lookup' draft"
    )
  return None


def _bound(name, default):
  try:
    return gin.query_parameter(name)
  except ValueError:
    return default


if __name__ == "__main__":
  cli.run(main)
