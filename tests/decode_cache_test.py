"""decode_cache.write: both scatters write exactly what a loop over rows writes."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from spec_decode.models import decode_cache


def _reference(keys_cache, values_cache, keys, values, positions):
  """Row by row and position by position, dropping what does not fit."""
  keys_cache, values_cache = keys_cache.copy(), values_cache.copy()
  capacity = keys_cache.shape[-1]
  for b, row in enumerate(positions):
    for t, position in enumerate(row):
      if position < capacity:
        keys_cache[b, :, :, position] = keys[b, :, :, t]
        values_cache[b, :, position] = values[b, :, t]
  return keys_cache, values_cache


class WriteTest(parameterized.TestCase):

  @parameterized.product(
      form=("_per_position", "_per_head", "write"),
      batch=(1, 3),
      num_new=(1, 4),
  )
  def test_matches_a_loop_over_rows(self, form, batch, num_new):
    heads, head_dim, capacity = 2, 3, 8
    rng = np.random.default_rng(batch * 10 + num_new)
    keys_cache = rng.normal(size=(batch, heads, head_dim, capacity)).astype(
        np.float32
    )
    values_cache = rng.normal(size=(batch, heads, capacity, head_dim)).astype(
        np.float32
    )
    keys = rng.normal(size=(batch, heads, head_dim, num_new)).astype(np.float32)
    values = rng.normal(size=(batch, heads, num_new, head_dim)).astype(
        np.float32
    )
    # Rows start anywhere, up to past the capacity (those writes drop).
    starts = rng.integers(0, capacity + 2, size=batch)
    starts[0] = capacity - 2  # straddles the end
    positions = starts[:, None] + np.arange(num_new)
    write = jax.jit(getattr(decode_cache, form))
    got = write(keys_cache, values_cache, keys, values, positions)
    want = _reference(keys_cache, values_cache, keys, values, positions)
    for g, w in zip(got, want):
      np.testing.assert_array_equal(np.asarray(g), w)


if __name__ == "__main__":
  absltest.main()
