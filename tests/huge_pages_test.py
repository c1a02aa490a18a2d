"""spec_decode.huge_pages: parameters moved onto 2 MiB pages, values unchanged.

The pages are read back from /proc/self/smaps: the AnonHugePages of the
memory areas that hold a buffer, before and after.
"""

import ctypes
import errno
import os
import platform
import time
from unittest import mock

from absl.testing import absltest
import gin
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import compare  # pylint: disable=unused-import  (gin)
from spec_decode import gin_config
from spec_decode import huge_pages
from spec_decode import pair
from spec_decode import vocabulary  # pylint: disable=unused-import  (gin)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Calls of huge_pages.collapse before the test gives up on the kernel.
_ATTEMPTS = 5


def _kernel_collapses():
  """Whether this kernel has MADV_COLLAPSE (Linux 6.1) and huge pages on."""
  if not platform.system() == "Linux":
    return False
  major, minor = (int(x) for x in platform.release().split(".")[:2])
  try:
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
      enabled = f.read()
  except OSError:
    return False
  return (major, minor) >= (6, 1) and "[never]" not in enabled


def _huge_bytes(address, size):
  """AnonHugePages, in bytes, of the memory areas [address, address + size)
  lies in."""
  total, inside = 0, False
  with open("/proc/self/smaps") as f:
    for line in f:
      head = line.split()[0]
      if "-" in head and not head.endswith(":"):
        start, end = (int(x, 16) for x in head.split("-"))
        inside = start < address + size and address < end
      elif inside and head == "AnonHugePages:":
        total += int(line.split()[1]) * 1024
  return total


def _full_pages(address, size):
  """How many whole 2 MiB pages lie inside [address, address + size)."""
  first = -(-address // huge_pages.PAGE_BYTES)
  return max(0, (address + size) // huge_pages.PAGE_BYTES - first)


@absltest.skipUnless(_kernel_collapses(), "no MADV_COLLAPSE on this kernel")
class CollapseTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    # 16 MiB written by XLA, so on malloc's 4 KiB pages.
    self.array = jnp.arange(4 << 20, dtype=jnp.float32) * 0.5
    self.array.block_until_ready()
    self.address = self.array.unsafe_buffer_pointer()
    self.expected = np.asarray(self.array).copy()

  def test_whole_pages_become_huge_and_values_stay(self):
    before = _huge_bytes(self.address, self.array.nbytes)
    full = _full_pages(self.address, self.array.nbytes)
    self.assertGreaterEqual(full, 7)
    # MADV_COLLAPSE fails when the kernel has no free 2 MiB page at that
    # moment (twice in CI, beside the other test process), and collapse then
    # leaves the pages as they are; a later call may find them.
    for _ in range(_ATTEMPTS):
      tree = huge_pages.collapse({"w": self.array, "step": 3})
      collapsed = _huge_bytes(self.address, self.array.nbytes) - before
      if collapsed >= full * huge_pages.PAGE_BYTES:
        break
      time.sleep(0.5)
    else:
      self._skip_unless_the_kernel_collapses(full, before)
    self.assertGreaterEqual(collapsed, full * huge_pages.PAGE_BYTES)
    self.assertIs(tree["w"], self.array)
    np.testing.assert_array_equal(np.asarray(self.array), self.expected)

  def _skip_unless_the_kernel_collapses(self, full, before):
    """Skips when the kernel would not collapse the buffer's pages itself.

    Collapses the buffer's `full` whole pages one by one, as `collapse`
    should have. When the kernel refuses a page (EAGAIN or ENOMEM: no free
    2 MiB page; any other error, named), or says yes and still leaves the
    pages small (twice in CI under the suite's load, none of 7 pages huge),
    `collapse` cannot be seen to work here: the test skips. When these
    calls make the pages huge, `collapse`'s did not: the test goes on, and
    fails on the count `collapse` left.

    Args:
      full: the buffer's whole 2 MiB pages.
      before: the buffer's huge bytes before the test.
    """
    first = -(-self.address // huge_pages.PAGE_BYTES)
    madvise = huge_pages._madvise()  # pylint: disable=protected-access
    flag = huge_pages._MADV_COLLAPSE  # pylint: disable=protected-access
    for page in range(first, first + full):
      if madvise(page * huge_pages.PAGE_BYTES, huge_pages.PAGE_BYTES, flag):
        error = ctypes.get_errno()
        reason = {
            errno.EAGAIN: "no free 2 MiB page now",
            errno.ENOMEM: "no free 2 MiB page now",
        }.get(error, "the kernel refused the page")
        self.skipTest(
            f"MADV_COLLAPSE: {errno.errorcode.get(error, error)}, "
            f"{os.strerror(error)} ({reason})"
        )
    huge = _huge_bytes(self.address, self.array.nbytes) - before
    if huge < full * huge_pages.PAGE_BYTES:
      self.skipTest(
          f"MADV_COLLAPSE succeeded on each of {full} pages, and "
          f"{huge // huge_pages.PAGE_BYTES} of them are huge: the kernel did "
          "not keep them"
      )

  def test_disabled_leaves_the_pages(self):
    before = _huge_bytes(self.address, self.array.nbytes)
    huge_pages.collapse([self.array], enabled=False)
    self.assertEqual(_huge_bytes(self.address, self.array.nbytes), before)


class PagesOfTest(absltest.TestCase):

  def test_pages_touched(self):
    mib = 1 << 20
    self.assertEqual(
        huge_pages.pages_of([(3 * mib, 2 * mib), (10 * mib, 1), (0, 1)]),
        [0, 1, 2, 5],
    )


class LoadModelTest(absltest.TestCase):

  def tearDown(self):
    gin.clear_config()
    super().tearDown()

  def test_loaded_parameters_are_collapsed(self):
    gin_config.parse(
        ["demo.gin"],
        [
            "draft/checkpoint_path.path ="
            f" '{_ROOT}/spec_decode/demo/draft_shared2_greedy_48m'"
        ],
    )
    with mock.patch.object(
        huge_pages, "collapse", wraps=huge_pages.collapse
    ) as collapse:
      loaded = pair.load_model("draft")
    collapse.assert_called_once()
    self.assertIs(collapse.call_args.args[0], loaded.params)
    self.assertTrue(
        all(isinstance(x, jax.Array) for x in jax.tree.leaves(loaded.params))
    )


if __name__ == "__main__":
  absltest.main()
