"""A run's batches through both decoders: timed, summed and written.

`decode` runs the baseline and the speculative decoder on each batch of
`compare.run`, times each (the median of `timing_repeats`, after an untimed
warm-up at each new input length), adds the batch's real rows to the run's
totals and writes their outputs.jsonl records as the batch ends, so an
interrupted run keeps the rows it decoded. Then it times each decoder's
set-up alone on every batch.
"""

import pathlib

import jax
import tqdm

from spec_decode import inputs as inputs_lib
from spec_decode import run_outputs
from spec_decode import run_totals
from spec_decode import timing


def decode(
    decoders,
    batches,
    texts,
    vocabulary,
    writer,
    *,
    batch_size,
    seed,
    timing_repeats,
    progress,
    allow_nonfinite,
    output_dir,
    **speculative,
):
  """Both decoders on every batch, each timed; the batch's rows written.

  Args:
    decoders: the run's engine.Engine.
    batches: (tokens, real rows) pairs, of `inputs_lib.batches`.
    texts: the inputs, one per real row.
    vocabulary: decodes the outputs.
    writer: a run_outputs.Writer (None off the first host).
    batch_size: rows per batch.
    seed: the sampling seed; batch i uses fold_in(seed, i) in both decoders.
    timing_repeats: timed runs per batch; the median counts.
    progress: show a progress bar (on the first host).
    allow_nonfinite: run on past rows with NaN or infinite target logits.
    output_dir: where the outputs go (named in the non-finite error).
    **speculative: the speculative decoder's settings (gamma,
      max_decode_len, config, verifier, draft_threshold).

  Returns:
    (the run's run_totals.RunTotals, its run_totals.Seconds).

  Raises:
    ValueError: unless `allow_nonfinite`, after the batch where the first
      row with non-finite logits appears (the writer then closed).
    KeyboardInterrupt: on Ctrl-C, saying what outputs.jsonl kept (the writer
      then closed).
  """
  totals = run_totals.RunTotals(speculative["gamma"])
  seconds = run_totals.Seconds()
  seen_shapes = set()
  with run_outputs.said_on_interrupt(writer, len(texts)):
    for index, (batch, num_real) in enumerate(
        tqdm.tqdm(
            batches,
            desc="decoding",
            unit="batch",
            disable=not progress or jax.process_index() != 0,
        )
    ):
      placed = decoders.place_inputs(inputs_lib.trim(batch))
      # Each new input length compiles both decoders: untimed.
      warm_up = placed.shape not in seen_shapes
      seen_shapes.add(placed.shape)
      (base, spec), batch_seconds = _decode_both(
          decoders,
          placed,
          jax.random.fold_in(jax.random.key(seed), index),
          timing_repeats,
          warm_up,
          **speculative,
      )
      seconds.add(batch_seconds)
      same, nonfinite = totals.add(base, spec, num_real)
      if writer is not None:
        writer.add_rows(
            _rows(
                texts[index * batch_size : index * batch_size + num_real],
                vocabulary,
                base,
                spec,
                same,
                nonfinite,
            )
        )
      if totals.nonfinite_rows and not allow_nonfinite:
        if writer is not None:
          writer.close()
        raise _nonfinite_error(
            totals.nonfinite_rows, index * batch_size + num_real, output_dir
        )
    seconds.baseline_setup, seconds.speculative_setup = _time_setups(
        decoders,
        batches,
        timing_repeats,
        gamma=speculative["gamma"],
        max_decode_len=speculative["max_decode_len"],
    )
  return totals, seconds


def _decode_both(decoders, placed, rng, repeats, warm_up, **speculative):
  """Both decoders on one batch, each timed (the median of `repeats`).

  Returns:
    ((baseline result, speculative result) on the host, the batch's
    run_totals.Seconds, its set-ups not yet timed).
  """
  common = dict(
      max_decode_len=speculative["max_decode_len"],
      config=speculative["config"],
  )
  base, base_seconds = timing.timed(
      lambda: decoders.baseline(placed, rng, **common),
      repeats,
      warm_up=warm_up,
  )
  spec, spec_seconds = timing.timed(
      lambda: decoders.speculative(placed, rng, **speculative),
      repeats,
      warm_up=warm_up,
  )
  seconds = run_totals.Seconds(base_seconds, spec_seconds, batches=1)
  return jax.device_get((base, spec)), seconds


def _time_setups(decoders, batches, repeats, *, gamma, max_decode_len):
  """Each decoder's set-up alone, over every batch (compiled already).

  Timed after all the decoding, so that no decoder's runs follow other
  work than they would in a run that times no set-up.

  Returns:
    (baseline set-up seconds, speculative set-up seconds), each the sum over
    the batches of their medians of `repeats`.
  """
  baseline = speculative = 0.0
  for batch, _ in batches:
    placed = decoders.place_inputs(inputs_lib.trim(batch))
    baseline += timing.median_seconds(
        lambda: decoders.baseline_setup(placed, max_decode_len=max_decode_len),
        repeats,
        warm_up=False,
    )
    speculative += timing.median_seconds(
        lambda: decoders.speculative_setup(
            placed, gamma=gamma, max_decode_len=max_decode_len
        ),
        repeats,
        warm_up=False,
    )
  return baseline, speculative


def _text(vocabulary, ids):
  ids = [int(i) for i in ids]
  if inputs_lib.EOS_ID in ids:
    ids = ids[: ids.index(inputs_lib.EOS_ID)]
  return vocabulary.decode(ids)


def _rows(texts, vocabulary, base, spec, same, nonfinite):
  """outputs.jsonl's records of a batch's real rows (one per text)."""
  return [
      {
          "input": text,
          "baseline": _text(vocabulary, base.sequences[row]),
          "speculative": _text(vocabulary, spec.sequences[row]),
          "identical": bool(same[row]),
          "nonfinite": bool(nonfinite[row]),
      }
      for row, text in enumerate(texts)
  ]


def _nonfinite_error(num_rows, num_decoded, output_dir):
  outputs = pathlib.Path(output_dir) / run_outputs.OUTPUTS_FILE
  return ValueError(
      f"{num_rows} of the {num_decoded} rows decoded so far had NaN or "
      "infinite target logits (a corrupt checkpoint, or overflow in "
      f"bfloat16), so their outputs are garbage; stopped (rows so far in "
      f"{outputs}); set run.allow_nonfinite = True to run on and count them"
  )
