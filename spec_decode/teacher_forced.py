"""Alpha from teacher-forced scores: a draft's acceptance with no loop.

At every position of the target's outputs (its samples, or references),
beta = sum_x min(p(x), q(x)) is the probability that the draft's token
there is accepted (Corollary 3.6 of Leviathan et al.), p and q being the
target's and the draft's distributions after the same temperature, top-k and
top-p. Both models score all positions of a batch in one forward pass each.
Alpha is the mean of beta over positions. On the target's own outputs this
is the alpha the speculative loop measures: the loop judges a drafted token
in the context of the target's outputs so far, the teacher-forced context
here. `spec_decode.alpha` is the command line; `benchmarks/table3.py`
tabulates many drafts.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from spec_decode import analysis
from spec_decode import engine
from spec_decode import inputs as inputs_lib
from spec_decode import lookup
from spec_decode import pair
from spec_decode import partitioning
from spec_decode import sampling
from spec_decode.models import t5

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


def teacher_forced_logits(
    model, params, inputs, outputs, target_encoded=None, encoded=None
):
  """The logits at every position of `outputs`, in one pass.

  Args:
    model: a T5 Transformer; or None for a draft with no model.
    params: its parameters; or a drafts.NgramModel or lookup.PromptLookup.
    inputs: int32 [B, S] encoder tokens.
    outputs: int32 [B, T] output tokens (0 after each row's end).
    target_encoded: [B, S, E] the target's encoding of `inputs`, which a
      shared-encoder draft reads; None for any other model.
    encoded: [B, S, E] the model's own `encode` of `inputs`, if already
      computed; None to encode here.

  Returns:
    [B, T, V] logits; position t is the distribution of outputs[:, t].
  """
  # [B, T] -> [B, T]: shifted right behind T5's start token, 0.
  decoder_inputs = jnp.pad(outputs[:, :-1], ((0, 0), (1, 0)))
  if isinstance(params, lookup.PromptLookup):
    cache = lookup.init_cache(inputs, outputs.shape[1])
    return params(decoder_inputs, cache)[0]
  if model is None:  # An n-gram model reads only the token before.
    cache = params.init_cache(outputs.shape[0])
    return params(decoder_inputs, cache)[0]
  if encoded is None:
    encoded = model.apply(
        {"params": params},
        inputs,
        target_encoded=target_encoded,
        method=t5.Transformer.encode,
    )
  return model.apply(
      {"params": params},
      encoded,
      inputs,
      decoder_inputs,
      method=t5.Transformer.decode_forced,
  )


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


def output_tokens(texts, vocabulary, max_decode_len):
  """Tokenized outputs ending in EOS, [N, max_decode_len], and lengths."""
  encoded = inputs_lib.encode(texts, vocabulary, max_decode_len, True)
  return encoded.tokens, np.sum(encoded.tokens > 0, axis=1)


class Scorer:
  """Teacher-forced betas of a target with each of its drafts.

  One compiled call per config scores a batch: the target's forward pass
  once, then each draft's.

  Attributes:
    target_model, target_params: the target T5.
    drafts: {name: (model, params)}: a T5 draft and its parameters, or None
      and a drafts.NgramModel or lookup.PromptLookup.
    mesh: the devices they are on.
  """

  def __init__(self, target_model, target_params, drafts, mesh):
    self.target_model, self.target_params = target_model, target_params
    self.draft_models = {name: model for name, (model, _) in drafts.items()}
    self.draft_params = {name: params for name, (_, params) in drafts.items()}
    self.mesh = mesh

  @functools.partial(jax.jit, static_argnums=0)
  def _betas(self, target_params, draft_params, inputs, outputs, config):
    encoded = self.target_model.apply(
        {"params": target_params}, inputs, method=t5.Transformer.encode
    )  # [B, S, E]
    target_logits = teacher_forced_logits(
        self.target_model, target_params, inputs, outputs, encoded=encoded
    )
    betas = {}
    for name, model in self.draft_models.items():
      shares = model is not None and model.config.shared_encoder_dim
      draft_logits = teacher_forced_logits(
          model,
          draft_params[name],
          inputs,
          outputs,
          target_encoded=encoded if shares else None,
      )
      betas[name] = position_betas(target_logits, draft_logits, config)
    return betas

  def __call__(self, inputs, outputs, config):
    """{name: float32 [B, T] betas} of outputs [B, T] for inputs [B, S]."""
    with partitioning.active(self.mesh):
      return self._betas(
          self.target_params, self.draft_params, inputs, outputs, config
      )


def betas_of(
    decoders,
    scorer,
    input_tokens,
    config,
    batch_size,
    max_decode_len,
    references=None,
    seed=0,
):
  """The outputs at one config, and each draft's beta at their positions.

  The target's samples are drawn once and scored for every draft.

  Args:
    decoders: an engine.Engine of the target (samples its outputs).
    scorer: a Scorer of the target with its drafts.
    input_tokens: int32 [N, S] encoded inputs.
    config: the SamplingConfig of the samples and of p and q.
    batch_size: rows per call.
    max_decode_len: T, most output tokens (EOS included).
    references: None to sample the target's outputs; else (int32 [N, T]
      tokens ending in EOS, int [N] lengths).
    seed: seeds the target's samples (batch i uses fold_in(key(seed), i)).

  Returns:
    (outputs int32 [N, T], {name: betas float32 [N, T]}, lengths int [N]).
  """
  outputs, lengths = [], []
  betas = {name: [] for name in scorer.draft_models}
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
    for name, value in scorer(placed, tokens, config).items():
      betas[name].append(np.asarray(value)[:num_real])
    outputs.append(np.asarray(tokens)[:num_real])
    lengths.append(np.asarray(rows)[:num_real])
  return (
      np.concatenate(outputs),
      {name: np.concatenate(b) for name, b in betas.items()},
      np.concatenate(lengths),
  )


def measure(
    input_tokens,
    configs,
    batch_size,
    max_decode_len,
    references=None,
    seed=0,
    model_free=None,
    on_estimate=None,
):
  """Alpha of the run's draft for its target at each of `configs`.

  Args:
    input_tokens: int32 [N, S] encoded inputs.
    configs: SamplingConfigs, one estimate each.
    batch_size: rows per call.
    max_decode_len: most output tokens (EOS included).
    references: see `betas_of`.
    seed: seeds the target's samples.
    model_free: a draft with no model to score (a drafts.NgramModel or a
      lookup.PromptLookup); None loads the T5 draft of the draft/ scope.
    on_estimate: called with each AlphaEstimate as soon as it is made.

  Returns:
    A list of AlphaEstimates, one per config.
  """
  mesh = partitioning.make_mesh()
  target = pair.load_model("target", mesh)
  if model_free is None:
    draft = pair.load_model("draft", mesh)
    pair.check_pair(target.config, draft.config)
    draft_model, draft_params = draft.model, draft.params
  elif isinstance(model_free, lookup.PromptLookup):
    draft_model, draft_params = None, model_free
  else:
    draft_model, draft_params = None, engine.place_ngram(model_free, mesh)
  decoders = engine.Engine(mesh, target.model, target.params)
  scorer = Scorer(
      target.model, target.params, {"draft": (draft_model, draft_params)}, mesh
  )
  estimates = []
  for config in configs:
    _, betas, lengths = betas_of(
        decoders,
        scorer,
        input_tokens,
        config,
        batch_size,
        max_decode_len,
        references,
        seed,
    )
    estimates.append(estimate(betas["draft"], lengths, config.temperature))
    if on_estimate is not None:
      on_estimate(estimates[-1])
  return estimates
