"""Honest timings: medians after a compiling warm-up, model calls in-graph."""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

# Model calls per timed in-graph loop: enough to amortize one dispatch.
CALLS_PER_LOOP = 64


def timed(run, repeats, warm_up=True):
  """Runs run() `repeats` times: its last result and the median seconds.

  Args:
    run: a function of no arguments returning arrays.
    repeats: timed runs, >= 1.
    warm_up: first run it once untimed (compilation).

  Returns:
    The last result and the median wall time in seconds.
  """
  if warm_up:
    jax.block_until_ready(run())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    result = jax.block_until_ready(run())
    times.append(time.perf_counter() - start)
  return result, float(np.median(times))


def median_seconds(run, repeats, warm_up=True):
  """The median wall time of run() (see `timed`)."""
  return timed(run, repeats, warm_up)[1]


def seconds_per_call(
    decode_fn, cache, num_tokens, position, repeats, calls=CALLS_PER_LOOP
):
  """Time of one decode_fn call on num_tokens tokens per row at `position`.

  The calls run in a jitted loop, as in the decoders, so that dispatch costs
  what it costs there.

  Args:
    decode_fn: a decode function (see `decoding.DecodeFn`).
    cache: its cache; every call starts at `position`.
    num_tokens: tokens per row per call (1 for a step, gamma + 1 to verify).
    position: the cache length each call starts from.
    repeats: timed loops; the median counts.
    calls: calls per loop.

  Returns:
    Seconds per call.
  """
  return (
      median_seconds(
          call_loop(decode_fn, cache, num_tokens, position, calls), repeats
      )
      / calls
  )


def call_loop(decode_fn, cache, num_tokens, position, calls=CALLS_PER_LOOP):
  """run() for `seconds_per_call`: `calls` jitted calls, timed as one.

  Returns:
    A function of no arguments that runs the calls.
  """
  batch_size = cache.lengths.shape[0]
  tokens = jnp.full((batch_size, num_tokens), 2, jnp.int32)
  lengths = jnp.full((batch_size,), position, jnp.int32)
  return lambda: _run_calls(decode_fn, cache, tokens, lengths, calls)


def interleaved_medians(runs, rounds):
  """Median seconds of each run of `interleaved_times`.

  Returns:
    {name: median seconds}.
  """
  return {
      name: float(np.median(values))
      for name, values in interleaved_times(runs, rounds).items()
  }


def interleaved_times(runs, rounds):
  """Seconds of each run in each round, the runs timed in turn.

  On a shared machine the load drifts within seconds; timing the runs in
  alternation exposes each to the same drift, so that their ratios hold
  where separate medians would not. Round r starts at run r (mod the number
  of runs), so that no run always follows the same one (a run can pay for
  what the previous one left in the caches).

  Args:
    runs: {name: a function of no arguments returning arrays}.
    rounds: timed rounds, >= 1, after a compiling warm-up of each run.

  Returns:
    {name: its seconds in rounds 0..rounds-1}.
  """
  for run in runs.values():
    jax.block_until_ready(run())
  names = list(runs)
  times = {name: [] for name in names}
  for round_index in range(rounds):
    start = round_index % len(names)
    for name in names[start:] + names[:start]:
      begin = time.perf_counter()
      jax.block_until_ready(runs[name]())
      times[name].append(time.perf_counter() - begin)
  return times


@functools.partial(jax.jit, static_argnames="calls")
def _run_calls(decode_fn, cache, tokens, lengths, calls):
  """`calls` decode calls from the same lengths; the sum of their logits."""
  batch_size = tokens.shape[0]

  # The cache is carried, as in the decoders, so that no call is loop
  # invariant (XLA would hoist it) or dead.
  def body(_, carry):
    cache, total = carry
    logits, cache = decode_fn(tokens, cache.replace(lengths=lengths))
    return cache, total + jnp.sum(logits, axis=(1, 2))

  _, total = jax.lax.fori_loop(
      0, calls, body, (cache, jnp.zeros((batch_size,)))
  )
  return total
