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

On the target's own outputs this is the alpha the speculative loop measures,
without its cost: the loop judges a drafted token in the context of the
target's outputs so far, which is the teacher-forced context here.
"""

import dataclasses
import functools
import json

from absl import flags
import gin
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from spec_decode import analysis
from spec_decode import cli
from spec_decode import compare
from spec_decode import engine
from spec_decode import inputs as inputs_lib
from spec_decode import pair
from spec_decode import partitioning
from spec_decode import sampling

_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "Temperatures.")
_REFERENCES = flags.DEFINE_string(
    "references", None, "Score these outputs (one a line) instead of samples."
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Rows per call.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the results JSON here.")
_SEED = flags.DEFINE_integer("seed", 0, "Seeds the target's samples.")

# Eq. 1 is tabulated for these gammas.
GAMMAS = tuple(range(1, 9))


@dataclasses.dataclass(frozen=True)
class AlphaEstimate:
  """Alpha at one temperature.

  Attributes:
    temperature: the sampling temperature of p and q (0: greedy).
    alpha: the mean of beta over output positions.
    standard_error: of alpha, over sentences (the ratio estimator's).
    positions: output positions scored.
    sentences: outputs scored.
  """

  temperature: float
  alpha: float
  standard_error: float
  positions: int
  sentences: int

  def tokens_per_call(self):
    """{gamma: expected tokens per target call (Eq. 1)} for GAMMAS."""
    alpha = min(self.alpha, 1.0)
    return {g: analysis.expected_tokens_per_call(alpha, g) for g in GAMMAS}


def position_betas(target_logits, draft_logits, config):
  """beta = sum_x min(p(x), q(x)) at each position, in float32.

  Args:
    target_logits: [B, T, V] the target's logits.
    draft_logits: [B, T, V] the draft's logits at the same positions.
    config: the SamplingConfig applied to both.

  Returns:
    float32 [B, T].
  """
  p = sampling.logits_to_probs(target_logits, config)
  q = sampling.logits_to_probs(draft_logits, config)
  return jnp.sum(jnp.minimum(p, q), axis=-1)


def teacher_forced_logits(model, params, inputs, outputs):
  """The logits at every position of `outputs`, in one pass.

  Args:
    model: a T5 Transformer; or None for an n-gram draft.
    params: its parameters; or the drafts.NgramModel.
    inputs: int32 [B, S] encoder tokens.
    outputs: int32 [B, T] output tokens (0 after each row's end).

  Returns:
    [B, T, V] logits; position t is the distribution of outputs[:, t].
  """
  # [B, T] -> [B, T]: shifted right behind T5's start token, 0.
  decoder_inputs = jnp.pad(outputs[:, :-1], ((0, 0), (1, 0)))
  if model is None:  # An n-gram model reads only the token before.
    cache = params.init_cache(outputs.shape[0])
    return params(decoder_inputs, cache)[0]
  return model.apply({"params": params}, inputs, decoder_inputs)


def estimate(betas, lengths, temperature):
  """Alpha and its standard error from per-position betas.

  Args:
    betas: float [N, T] beta at each position.
    lengths: int [N] scored positions of each row (its first `length`).
    temperature: recorded in the result.

  Returns:
    An AlphaEstimate (see `from_sums`).
  """
  betas = np.asarray(betas, np.float64)
  lengths = np.asarray(lengths)
  mask = np.arange(betas.shape[1])[None, :] < lengths[:, None]
  return from_sums(np.sum(betas * mask, axis=1), lengths, temperature)


def from_sums(sums, counts, temperature):
  """Alpha from each sentence's beta sum and position count.

  Args:
    sums: float [M] the sum of beta over each sentence's scored positions.
    counts: int [M] how many positions each sentence has.
    temperature: recorded in the result.

  Returns:
    An AlphaEstimate. Alpha is sum(sums) / sum(counts); its standard error
    the ratio estimator's over sentences,
    sqrt(sum_i (s_i - alpha n_i)^2 / (M (M - 1))) / mean(n).
  """
  sums = np.asarray(sums, np.float64)
  counts = np.asarray(counts, np.float64)
  value = float(np.sum(sums) / np.sum(counts))
  m = len(counts)
  variance = np.sum((sums - value * counts) ** 2) / max(m * (m - 1), 1)
  return AlphaEstimate(
      temperature=float(temperature),
      alpha=value,
      standard_error=float(np.sqrt(variance) / np.mean(counts)),
      positions=int(np.sum(counts)),
      sentences=m,
  )


def _output_tokens(texts, vocabulary, max_decode_len):
  """Tokenized outputs ending in EOS, [N, max_decode_len], and lengths."""
  encoded = inputs_lib.encode(texts, vocabulary, max_decode_len, True)
  return encoded.tokens, np.sum(encoded.tokens > 0, axis=1)


class Scorer:
  """Teacher-forced betas of a target and a draft, compiled once per config.

  Attributes:
    target_model, target_params: the target T5.
    draft_model, draft_params: the draft T5; or None and a drafts.NgramModel.
    mesh: the devices they are on.
  """

  def __init__(self, target_model, target_params, draft_model, draft_params,
               mesh):
    self.target_model, self.target_params = target_model, target_params
    self.draft_model, self.draft_params = draft_model, draft_params
    self.mesh = mesh

  @functools.partial(jax.jit, static_argnums=(0, 5))
  def _betas(self, target_params, draft_params, inputs, outputs, config):
    return position_betas(
        teacher_forced_logits(self.target_model, target_params, inputs,
                              outputs),
        teacher_forced_logits(self.draft_model, draft_params, inputs, outputs),
        config,
    )

  def __call__(self, inputs, outputs, config):
    with partitioning.active(self.mesh):
      return self._betas(
          self.target_params, self.draft_params, inputs, outputs, config
      )


def betas_of(
    decoders,
    score,
    input_tokens,
    config,
    batch_size,
    max_decode_len,
    references=None,
    seed=0,
):
  """The outputs scored at one config, and beta at each of their positions.

  Args:
    decoders: an engine.Engine of the target (samples its outputs).
    score: a Scorer of the pair.
    input_tokens: int32 [N, S] encoded inputs.
    config: the SamplingConfig of the samples and of p and q.
    batch_size: rows per call.
    max_decode_len: T, most output tokens (EOS included).
    references: None to sample the target's outputs; else (int32 [N, T]
      tokens ending in EOS, int [N] lengths).
    seed: seeds the target's samples (batch i uses fold_in(key(seed), i)).

  Returns:
    (outputs int32 [N, T], betas float32 [N, T], lengths int [N]).
  """
  outputs, betas, lengths = [], [], []
  batches = inputs_lib.batches(input_tokens, batch_size)
  for index, (batch, num_real) in enumerate(tqdm.tqdm(list(batches))):
    placed = decoders.place_inputs(batch)
    if references is None:
      result = decoders.baseline(
          placed,
          jax.random.fold_in(jax.random.key(seed), index),
          max_decode_len=max_decode_len,
          config=config,
      )
      tokens, rows = jax.device_get((result.sequences, result.lengths))
    else:
      start = index * batch_size
      tokens = np.zeros((batch_size, max_decode_len), np.int32)
      rows = np.ones(batch_size, np.int64)
      tokens[:num_real] = references[0][start : start + num_real]
      rows[:num_real] = references[1][start : start + num_real]
    betas.append(np.asarray(score(placed, tokens, config))[:num_real])
    outputs.append(np.asarray(tokens)[:num_real])
    lengths.append(np.asarray(rows)[:num_real])
  return tuple(np.concatenate(x) for x in (outputs, betas, lengths))


def measure(
    input_tokens,
    configs,
    batch_size,
    max_decode_len,
    references=None,
    seed=0,
    ngram=None,
):
  """Alpha of the run's draft for its target at each of `configs`.

  Args:
    input_tokens: int32 [N, S] encoded inputs.
    configs: SamplingConfigs, one estimate each.
    batch_size: rows per call.
    max_decode_len: most output tokens (EOS included).
    references: see `betas_of`.
    seed: seeds the target's samples.
    ngram: a drafts.NgramModel to score as the draft; None loads the T5
      draft of the draft/ scope.

  Returns:
    A list of AlphaEstimates, one per config.
  """
  mesh = partitioning.make_mesh()
  target = pair.load_model("target", mesh)
  if ngram is None:
    draft = pair.load_model("draft", mesh)
    pair.check_same_vocab(target.config, draft.config)
    draft_model, draft_params = draft.model, draft.params
  else:
    draft_model, draft_params = None, engine.place_ngram(ngram, mesh)
  decoders = engine.Engine(mesh, target.model, target.params)
  score = Scorer(target.model, target.params, draft_model, draft_params, mesh)
  estimates = []
  for config in configs:
    _, betas, lengths = betas_of(
        decoders,
        score,
        input_tokens,
        config,
        batch_size,
        max_decode_len,
        references,
        seed,
    )
    estimates.append(estimate(betas, lengths, config.temperature))
  return estimates


def format_estimates(estimates):
  """One line per temperature: alpha, its error, tokens per call by gamma."""
  header = "temperature  alpha   s.e.    positions  tokens/call at gamma " + (
      " ".join(f"{g:>5d}" for g in GAMMAS)
  )
  lines = [header]
  for e in estimates:
    calls = " ".join(f"{t:5.2f}" for t in e.tokens_per_call().values())
    lines.append(
        f"{e.temperature:<11g}  {e.alpha:.3f}  {e.standard_error:.4f}  "
        f"{e.positions:>9d}  {'':20s} {calls}"
    )
  return "\n".join(lines)


def main(argv):
  with cli.one_line_errors():
    cli.start(argv)
    # pylint: disable=g-import-not-at-top
    from spec_decode import data
    from spec_decode import vocabulary as vocabulary_lib
    # pylint: enable=g-import-not-at-top

    vocabulary = vocabulary_lib.bound_for_run()
    max_decode_len = gin.query_parameter("run.max_decode_len")
    tokens = inputs_lib.encode(
        inputs_lib.read_inputs(),
        vocabulary,
        gin.query_parameter("run.max_input_len"),
        True,
    ).tokens
    references = None
    if _REFERENCES.value:
      texts = data.read_lines(_REFERENCES.value)
      if len(texts) < len(tokens):
        raise ValueError(
            f"--references has {len(texts)} lines, fewer than the "
            f"{len(tokens)} inputs"
        )
      references = _output_tokens(
          texts[: len(tokens)], vocabulary, max_decode_len
      )
    ngram = None
    kind = _bound("run.draft", "t5")
    if kind in ("unigram", "bigram"):
      ngram = compare.ngram_params(
          kind,
          _bound("run.ngram_corpus", None),
          vocabulary,
          pair.model_config("target").vocab_size,
      )
    elif kind != "t5":
      raise ValueError(
          f"run.draft={kind!r}: spec_decode.alpha scores a 't5', 'unigram' "
          "or 'bigram' draft"
      )
    configs = [
        sampling.SamplingConfig(
            float(t),
            _bound("run.top_k", 0),
            _bound("run.top_p", 1.0),
        )
        for t in _TEMPERATURES.value
    ]
    estimates = measure(
        tokens,
        configs,
        _BATCH_SIZE.value,
        max_decode_len,
        references,
        _SEED.value,
        ngram,
    )
  print(format_estimates(estimates))
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      records = [
          {**dataclasses.asdict(e), "tokens_per_call": e.tokens_per_call()}
          for e in estimates
      ]
      f.write(json.dumps(records, indent=2) + "\n")


def _bound(name, default):
  try:
    return gin.query_parameter(name)
  except ValueError:
    return default


if __name__ == "__main__":
  cli.run(main)
