"""Padded encoder-decoder batches of a seqio task, optionally length-bucketed.

The tasks are `spec_decode.data`'s (registered when it is imported). Batches
are what t5x's trainer feeds a model: `seqio.EncDecFeatureConverter`'s
features, unpacked.

Usage:
  for batch in batching.batches(data.MULTI30K, "validation", 64,
                                {"inputs": 48, "targets": 48}):
    batch["encoder_input_tokens"]  # int32 [64, 48]
"""

from collections.abc import Mapping, Sequence

import seqio
import tensorflow as tf

# Importing it registers the tasks.
from spec_decode import data  # pylint: disable=unused-import


def _bucket_by_length(dataset, batch_size, buckets):
  """Batches examples of like length, each batch cut to its bucket's shape.

  Args:
    dataset: padded examples (`seqio.EncDecFeatureConverter`'s features).
    batch_size: B.
    buckets: increasing (S_i, T_i) pairs, the last the padded lengths. An
      example goes to the first bucket that holds both its input and its
      target.

  Returns:
    A dataset of full batches, [B, S_i] and [B, T_i].
  """
  input_limits = tf.constant([s for s, _ in buckets])
  target_limits = tf.constant([t for _, t in buckets])

  def bucket_of(example):
    inputs = tf.reduce_sum(
        tf.cast(example["encoder_input_tokens"] > 0, tf.int32)
    )
    targets = tf.reduce_sum(example["decoder_loss_weights"])
    fits = (inputs <= input_limits) & (targets <= target_limits)
    return tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int64)

  def cut(key, window):
    inputs, targets = input_limits[key], target_limits[key]
    return window.batch(batch_size, drop_remainder=True).map(
        lambda batch: {
            name: feature[
                :, : inputs if name.startswith("encoder") else targets
            ]
            for name, feature in batch.items()
        }
    )

  return dataset.group_by_window(bucket_of, cut, window_size=batch_size)


def batches(
    task_name,
    split,
    batch_size,
    feature_lengths: Mapping[str, int],
    shuffle=False,
    seed=None,
    num_epochs=1,
    drop_remainder=False,
    length_buckets: Sequence[tuple[int, int]] = (),
):
  """Padded encoder-decoder batches of a seqio task.

  Args:
    task_name: a registered seqio task.
    split: its split.
    batch_size: B, the examples per batch.
    feature_lengths: {'inputs': S, 'targets': T}; longer examples are cut
      (keeping the EOS).
    shuffle: shuffle the examples (training).
    seed: the shuffle's seed.
    num_epochs: passes over the split; None repeats forever.
    drop_remainder: drop a last batch of fewer than B examples.
    length_buckets: increasing (S_i, T_i) pairs below (S, T). If any, batches
      group examples of like length and are padded only to their bucket's
      lengths (one compiled shape each): padding drops from 57% to 20% of
      Multi30k's training tokens with ((24, 16), (32, 24), (40, 32)). Every
      batch is then full, and the order across buckets is not the input's.

  Returns:
    An iterator of dicts of int32 numpy arrays: 'encoder_input_tokens' [B, S],
    'decoder_input_tokens', 'decoder_target_tokens' and
    'decoder_loss_weights', each [B, T]. Padding is 0, and the decoder's
    inputs are its targets shifted right behind a 0.
  """
  lengths = {
      "inputs": feature_lengths["inputs"],
      "targets": feature_lengths["targets"],
  }
  dataset = seqio.get_dataset(
      task_name,
      task_feature_lengths=lengths,
      feature_converter=seqio.EncDecFeatureConverter(pack=False),
      dataset_split=split,
      shuffle=shuffle,
      seed=seed,
      num_epochs=num_epochs,
      verbose=False,
  )
  if length_buckets:
    buckets = [*length_buckets, (lengths["inputs"], lengths["targets"])]
    dataset = _bucket_by_length(dataset, batch_size, buckets)
  else:
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
  return dataset.prefetch(tf.data.AUTOTUNE).as_numpy_iterator()
