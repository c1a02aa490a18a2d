r"""What a few rows times a weight matrix cost on this machine's CPU.

  python benchmarks/small_dots.py --output=benchmarks/results/small_dots.json

A target's (gamma+1)-token call multiplies gamma + 1 rows of activations by
each weight matrix; a step multiplies one row. Where the weights stream from
DRAM, both should cost about the time of reading the weights (Theorem 3.8's
premise). This times exactly that, with nothing else around it: M rows
(float32 [M, 512]) times each of 24 float32 [512, 2048] matrices (96 MB, more
than any L3 cache here), for M = 1..8, in one jitted XLA program and in
NumPy (OpenBLAS), and prints each M's time over M = 1's. The demo target's
MLP kernels have this shape.
"""

import json
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import machine

_OUTPUT = flags.DEFINE_string("output", None, "Write the results JSON here.")
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed runs; medians count.")
_MAX_ROWS = flags.DEFINE_integer("max_rows", 8, "The largest M.")

# The demo target's MLP kernel, [emb_dim, mlp_dim], and enough of them to
# exceed a 32 MiB L3 cache three times over.
SHAPE = (512, 2048)
NUM_MATRICES = 24


def _median_ms(run, repeats):
  run()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return 1e3 * float(np.median(times))


@jax.jit
def _xla_products(rows, weights):
  """Every [M, K] x [K, N] product, each kept (summed) so none is dropped."""
  return sum(jnp.sum(rows @ w, axis=1) for w in weights)


def measure(repeats, max_rows):
  """ms per pass over the matrices, by M, in XLA and NumPy."""
  rng = np.random.default_rng(0)
  weights = [
      rng.standard_normal(SHAPE, np.float32) for _ in range(NUM_MATRICES)
  ]
  device_weights = [jnp.asarray(w) for w in weights]
  results = {"xla_ms": {}, "numpy_ms": {}}
  for m in range(1, max_rows + 1):
    rows = rng.standard_normal((m, SHAPE[0]), np.float32)
    device_rows = jnp.asarray(rows)
    results["xla_ms"][m] = _median_ms(
        lambda: _xla_products(device_rows, device_weights).block_until_ready(),
        repeats,
    )
    results["numpy_ms"][m] = _median_ms(
        lambda: [rows @ w for w in weights], repeats
    )
  for name in ("xla", "numpy"):
    ms = results[f"{name}_ms"]
    results[f"{name}_over_1_row"] = {m: ms[m] / ms[1] for m in ms}
  return results


def main(argv):
  del argv
  results = {
      "machine": machine.describe(),
      "shape": SHAPE,
      "num_matrices": NUM_MATRICES,
      "megabytes": NUM_MATRICES * SHAPE[0] * SHAPE[1] * 4 / 1e6,
      "repeats": _REPEATS.value,
      **measure(_REPEATS.value, _MAX_ROWS.value),
  }
  print(machine.summary(results["machine"]))
  for name in ("xla", "numpy"):
    line = " ".join(
        f"{m}:{ms:.2f}ms({results[f'{name}_over_1_row'][m]:.2f})"
        for m, ms in results[f"{name}_ms"].items()
    )
    print(f"{name:5s} rows:ms(over 1 row) {line}", flush=True)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      f.write(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
  app.run(main)
