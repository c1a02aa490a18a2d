"""Both decoders' greedy loops over batches, set up beforehand, for timing.

`benchmarks/loop_overhead.py` and `benchmarks/option_ab.py` time the
baseline's loop (the target alone) and the speculative decoder's over the same
batches, without their set-ups: each batch's caches are made once, here, and
every run of a loop decodes from them (the decoders do not donate caches they
are handed as arguments).

Usage:
  decoders = greedy_loops.set_up(target, draft, batches, gamma=3,
                                 max_decode_len=64)
  run_baseline = greedy_loops.baseline(decoders, max_decode_len=64, eos_id=1)
  results = run_baseline()    # one DecodeResult per batch
"""

import dataclasses

import jax

from spec_decode import decoding
from spec_decode import drafts
from spec_decode import sampling
from spec_decode import speculative

GREEDY = sampling.SamplingConfig(temperature=0.0)


@dataclasses.dataclass(frozen=True)
class BatchDecoders:
  """One batch's decoders, their caches empty.

  Attributes:
    baseline: the target, with max_decode_len positions.
    verifier: the target, with `drafts.speculative_capacity` positions.
    proposer: the draft (or the target as its own draft), as many.
  """

  baseline: drafts.Draft
  verifier: drafts.Draft
  proposer: drafts.Draft


def set_up(target, draft, batches, *, gamma, max_decode_len):
  """Each batch's decoders.

  Args:
    target: a pair.LoadedModel.
    draft: a pair.LoadedModel, or None for the target as its own draft.
    batches: int32 [B, S] input batches.
    gamma, max_decode_len: the speculative decoder's setting.

  Returns:
    A list of BatchDecoders, one per batch.
  """
  capacity = drafts.speculative_capacity(max_decode_len, gamma)
  decoders = []
  for inputs in batches:
    if draft is None:
      verifier = drafts.t5_draft(target.model, target.params, inputs, capacity)
      proposer = drafts.target_as_draft(verifier.decode_fn, verifier.cache)
    else:
      verifier, proposer = drafts.t5_pair(
          target.model,
          target.params,
          draft.model,
          draft.params,
          inputs,
          capacity,
      )
    baseline = drafts.t5_draft(
        target.model, target.params, inputs, max_decode_len
    )
    decoders.append(BatchDecoders(baseline, verifier, proposer))
  return decoders


def baseline(decoders, *, max_decode_len, eos_id):
  """A function that decodes every batch greedily with the target alone."""
  return lambda: [
      decoding.autoregressive_decode(
          d.baseline.decode_fn,
          d.baseline.cache,
          jax.random.key(0),
          max_decode_len=max_decode_len,
          eos_id=eos_id,
          config=GREEDY,
      )
      for d in decoders
  ]


def speculative_loop(decoders, *, gamma, max_decode_len, eos_id):
  """A function that decodes every batch greedily, speculatively."""
  return lambda: [
      speculative.speculative_decode(
          d.verifier.decode_fn,
          d.proposer.decode_fn,
          d.verifier.cache,
          d.proposer.cache,
          jax.random.key(0),
          gamma=gamma,
          max_decode_len=max_decode_len,
          eos_id=eos_id,
          config=GREEDY,
      )
      for d in decoders
  ]
