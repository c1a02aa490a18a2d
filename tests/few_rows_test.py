"""spec_decode/kernels/few_rows: the CPU kernel for a few rows times [N, K].

Reference products are float64 NumPy; the kernel sums in float32, so the
tolerance is float32 rounding over K terms.
"""

import os
import pathlib
import subprocess
import sys
import tempfile
import threading

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.kernels import few_rows

_ROOT = pathlib.Path(__file__).resolve().parent.parent


def _operands(lead, k, n, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(lead + (k,)).astype(np.float32)
  w = rng.standard_normal((n, k)).astype(np.float32)
  return x, w


def _reference(x, w):
  return np.einsum("...k,nk->...n", x.astype(np.float64), w.astype(np.float64))


class FewRowsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.assertTrue(few_rows.available(), "the kernel did not build")

  @parameterized.product(
      # 1-16 rows in passes over groups of rows, 17-64 in tiles of 4 rows by
      # 3 weight rows (with 1-3 rows and 1-2 weight rows left over).
      rows=(1, 2, 3, 5, 7, 8, 13, 16, 17, 22, 31, 64),
      # K: a multiple of 16, 8 but not 16, and a scalar tail; N crosses the
      # 64-row chunks and the 48-row blocks (for K 512) the threads claim,
      # and leaves 1 or 2 weight rows past the last full tile. Products of
      # 256K weights or more (512 x 520) are split over the kernel's threads,
      # smaller ones run on the calling thread alone.
      k_n=((512, 520), (512, 130), (24, 64), (40, 50), (13, 3), (1, 1)),
  )
  def test_matches_float64(self, rows, k_n):
    k, n = k_n
    x, w = _operands((rows,), k, n)
    self.assertTrue(few_rows.applies(jnp.asarray(x), jnp.asarray(w)))
    got = np.asarray(jax.jit(few_rows.product)(x, w))
    self.assertEqual(got.dtype, np.float32)
    bound = 4 * np.finfo(np.float32).eps * np.abs(x) @ np.abs(w).T
    np.testing.assert_array_less(np.abs(got - _reference(x, w)), bound + 1e-30)

  def test_empty_contraction_is_zeros(self):
    x, w = _operands((2,), 0, 3)
    got = jax.jit(few_rows._kernel_product)(x, w)
    np.testing.assert_array_equal(got, np.zeros((2, 3), np.float32))

  def test_leading_axes(self):
    x, w = _operands((2, 3), 40, 17)
    got = jax.jit(few_rows.product)(x, w)
    self.assertEqual(got.shape, (2, 3, 17))
    np.testing.assert_allclose(got, _reference(x, w), rtol=1e-5, atol=1e-5)

  @parameterized.parameters(
      # Split over the kernel's threads (600 x 512 weights); an odd number of
      # weight rows, with a chunk of 8 and a scalar tail of k (601 x 525);
      # small enough for the calling thread alone (63 x 37).
      (512, 600),
      (525, 601),
      (37, 63),
  )
  def test_a_row_is_the_same_alone_and_among_few_others(self, k, n):
    # Up to 16 rows the summation order is fixed: a decode step's row and
    # the same row in a verification call get bit-identical sums, and so do
    # repeated calls, whichever of the kernel's threads computes them, and
    # whether a group of rows takes one weight row a pass or two (AVX-512
    # hosts, 3-6 rows).
    few = few_rows.TILE_MIN_ROWS - 1
    x, w = _operands((few,), k, n)
    product = jax.jit(few_rows.product)
    together = np.asarray(product(x, w))
    np.testing.assert_array_equal(np.asarray(product(x, w)), together)
    for m in range(1, few):
      np.testing.assert_array_equal(np.asarray(product(x[:m], w)), together[:m])
      np.testing.assert_array_equal(
          np.asarray(product(x[m : m + 1], w))[0], together[m]
      )

  @parameterized.parameters((512, 600), (525, 601), (37, 63))
  def test_a_row_is_the_same_among_any_number_of_many(self, k, n):
    # From TILE_MIN_ROWS rows the products are computed in tiles, one
    # accumulator an element: a row's sums are the same bits whatever the
    # number of rows, whichever tile (a full one, or one of the 1-3 rows or
    # 1-2 weight rows left over) and thread compute them.
    least = few_rows.TILE_MIN_ROWS
    x, w = _operands((few_rows.MAX_ROWS,), k, n)
    product = jax.jit(few_rows.product)
    together = np.asarray(product(x, w))
    np.testing.assert_array_equal(np.asarray(product(x, w)), together)
    for m in range(least, few_rows.MAX_ROWS):
      np.testing.assert_array_equal(np.asarray(product(x[:m], w)), together[:m])
      # The same rows shifted to other places in their tiles.
      start = m - least + 1
      np.testing.assert_array_equal(
          np.asarray(product(x[start : start + least], w)),
          together[start : start + least],
      )

  @parameterized.parameters(5, 24)
  def test_concurrent_callers_get_the_same_sums(self, rows):
    # Products of several rows run on the kernel's worker threads, one job at
    # a time; a caller that finds them busy computes its product alone. Both
    # give the same bits as a lone call, in passes over groups of rows and in
    # tiles.
    x, w = _operands((rows,), 512, 600)
    product = jax.jit(few_rows.product)
    expected = np.asarray(product(x, w))
    results = [[] for _ in range(4)]

    def call(out):
      for _ in range(25):
        out.append(np.asarray(product(x, w)))

    threads = [threading.Thread(target=call, args=(r,)) for r in results]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    for got in (g for r in results for g in r):
      np.testing.assert_array_equal(got, expected)
    self.assertEqual(sum(map(len, results)), 100)

  def test_outside_its_range_it_is_xla_dot(self):
    x, w = _operands((few_rows.MAX_ROWS + 1,), 32, 16)
    self.assertFalse(few_rows.applies(jnp.asarray(x), jnp.asarray(w)))
    bf16 = jnp.asarray(x[:2], jnp.bfloat16)
    self.assertFalse(few_rows.applies(bf16, jnp.asarray(w, jnp.bfloat16)))
    np.testing.assert_array_equal(
        jax.jit(few_rows.product)(x, w),
        jax.jit(lambda a, b: jnp.einsum("...k,nk->...n", a, b))(x, w),
    )
    self.assertNotIn(
        "custom_call",
        jax.jit(few_rows.product).lower(x, w).as_text(),
    )
    self.assertIn(
        "custom_call",
        jax.jit(few_rows.product).lower(x[: few_rows.MAX_ROWS], w).as_text(),
    )

  def test_not_inside_a_multi_device_mesh(self):
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    x, w = _operands((2,), 32, 16)
    with jax.set_mesh(mesh):
      self.assertFalse(few_rows.applies(jnp.asarray(x), jnp.asarray(w)))

  def test_gradient_is_the_einsum_gradient(self):
    x, w = _operands((3,), 24, 10)

    def loss(product, a, b):
      return jnp.sum(jnp.sin(product(a, b)))

    got = jax.grad(lambda a, b: loss(few_rows.product, a, b), (0, 1))(x, w)
    expected = jax.grad(
        lambda a, b: loss(lambda c, d: jnp.einsum("mk,nk->mn", c, d), a, b),
        (0, 1),
    )(x, w)
    for g, e in zip(got, expected):
      np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)

  def test_vmap_and_loops(self):
    x, w = _operands((4, 2), 24, 10)
    got = jax.jit(jax.vmap(few_rows.product, in_axes=(0, None)))(x, w)
    np.testing.assert_allclose(got, _reference(x, w), rtol=1e-5, atol=1e-5)

    def body(carry, row):
      return carry + few_rows.product(row, w).sum(), None

    total, _ = jax.jit(lambda xs: jax.lax.scan(body, 0.0, xs))(x)
    np.testing.assert_allclose(total, _reference(x, w).sum(), rtol=1e-4)


class BuildTest(absltest.TestCase):

  def test_a_forked_child_has_its_own_workers(self):
    # The parent's worker threads do not exist in a forked child: its first
    # product of several rows (4096 x 64 weights, enough to be split) must
    # start workers of its own, not wait on the parent's forever.
    script = (
        "import os, numpy as np, jax\n"
        "from spec_decode.kernels import few_rows\n"
        "x = np.ones((5, 64), np.float32)\n"
        "w = np.ones((4096, 64), np.float32)\n"
        "product = jax.jit(few_rows.product)\n"
        "assert few_rows.available() and float(product(x, w)[4, 4095]) == 64\n"
        # Placed before the fork: placing the 1 MB w in the child hung it.
        "x, w = jax.block_until_ready(jax.device_put((x + 1, w)))\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "  ok = float(np.asarray(product(x, w)).sum()) == 5 * 4096 * 128\n"
        "  os._exit(0 if ok else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('child', os.waitstatus_to_exitcode(status))\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        cwd=_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    self.assertIn("child 0", done.stdout)

  def test_without_a_compiler_the_model_falls_back_with_a_warning(self):
    # A fresh process, whose kernel cache is empty and which finds no
    # compiler: `available` is False, says why, and products still run.
    script = (
        "import numpy as np\n"
        "from spec_decode.kernels import few_rows\n"
        "x = np.ones((2, 8), np.float32); w = np.ones((3, 8), np.float32)\n"
        "print(few_rows.available(), few_rows.product(x, w).tolist())\n"
    )
    env = dict(
        os.environ,
        CXX="",
        PATH="/nonexistent",
        SPEC_DECODE_CACHE=self.enterContext(tempfile.TemporaryDirectory()),
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    self.assertEqual(
        done.stdout.strip(), "False [[8.0, 8.0, 8.0], [8.0, 8.0, 8.0]]"
    )
    self.assertIn("few-rows CPU kernel unavailable", done.stderr)
    self.assertIn("no C++ compiler", done.stderr)


if __name__ == "__main__":
  absltest.main()
