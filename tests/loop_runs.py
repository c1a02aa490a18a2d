"""Runs of the decoding loops on fake models, shared by the loop's tests.

The greedy configuration and the fake models' vocabulary, a speculative run
and its autoregressive baseline, and a check of a run's per-token trace; used
by speculative_greedy_test.py, speculative_counts_test.py and
speculative_verifiers_test.py.
"""

import jax
import numpy as np

from spec_decode import decoding
from spec_decode import drafts
from spec_decode import sampling
from spec_decode import speculative

GREEDY = sampling.SamplingConfig(temperature=0.0)
VOCAB_SIZE = 16
# Batch sizes of the greedy equality tests (issue 3: 1, 3 and 8).
BATCH_SIZES = (1, 3, 8)


def fake_draft(model, contexts, capacity):
  return drafts.Draft(model, model.init_cache(contexts, capacity))


def run_speculative(
    target,
    draft,
    contexts,
    *,
    gamma,
    max_decode_len,
    config,
    seed=0,
    draft_threshold=0.0,
):
  """Runs speculative_decode on fake models; draft is a drafts.Draft."""
  return speculative.speculative_decode(
      target,
      draft.decode_fn,
      target.init_cache(contexts, max_decode_len + gamma + 1),
      draft.cache,
      jax.random.key(seed),
      gamma=gamma,
      max_decode_len=max_decode_len,
      config=config,
      draft_threshold=draft_threshold,
  )


def run_baseline(target, contexts, *, max_decode_len, config, seed=0):
  return decoding.autoregressive_decode(
      target,
      target.init_cache(contexts, max_decode_len),
      jax.random.key(seed),
      max_decode_len=max_decode_len,
      config=config,
  )


def check_token_sources(result):
  """The per-token trace agrees with the counts and with itself."""
  sources = np.asarray(result.token_sources)
  rejected = np.asarray(result.rejected_tokens)
  positions = np.arange(sources.shape[1])[None, :]
  live = positions < np.asarray(result.lengths)[:, None]
  np.testing.assert_array_equal(sources[~live], speculative.PADDING)
  np.testing.assert_array_equal(
      np.sum(sources == speculative.ACCEPTED, axis=1), result.accepted_tokens
  )
  # One REPLACEMENT or BONUS per target call, except the last call of a row
  # cut short by EOS or max_decode_len.
  closing = np.sum(sources >= speculative.REPLACEMENT, axis=1)
  calls = np.asarray(result.target_calls)
  np.testing.assert_array_less(calls - 2, closing)
  np.testing.assert_array_less(closing, calls + 1)
  is_replacement = sources == speculative.REPLACEMENT
  np.testing.assert_array_equal(rejected[~is_replacement], -1)
  np.testing.assert_array_less(-1, rejected[is_replacement])
  # A greedy target never replaces a draft with the draft's own token.
  replaced = np.asarray(result.sequences)[is_replacement]
  np.testing.assert_array_less(0, np.abs(replaced - rejected[is_replacement]))
