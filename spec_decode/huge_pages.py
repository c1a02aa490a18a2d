"""Parameters on the CPU backed by 2 MiB pages, where Linux allows it.

XLA:CPU allocates its buffers with malloc, on 4 KiB pages (numpy asks for
transparent huge pages for its large arrays; XLA does not). A decode step
streams every weight of the decoder from memory: the demo target's 134 MB
are 33,000 pages, one TLB miss each, and the hardware prefetchers stop at
every page boundary. `collapse` asks the kernel to move the parameters'
memory onto 2 MiB pages in place (madvise MADV_COLLAPSE, Linux 6.1+), after
they are placed. The values do not change, only the pages under them. On the
demo's 2-core EPYC the target's 1-token call went from 3.7-4.4 ms to 3.4-3.5
(README, "A sixth session: parameters on 2 MiB pages").

Elsewhere (another OS, an older kernel, an accelerator, or
`collapse.enabled = False`) it does nothing. A page range the kernel refuses
(memory too fragmented) stays on small pages.

Usage:
  params = huge_pages.collapse(params)
"""

import ctypes
import errno
import functools
import sys

from absl import logging
import gin
import jax

# 2 MiB: the x86-64 and arm64 (4 KiB granule) transparent huge page.
PAGE_BYTES = 2 << 20
# <sys/mman.h>: synchronous collapse into transparent huge pages (Linux 6.1).
_MADV_COLLAPSE = 25


@functools.cache
def _madvise():
  """libc's madvise, or None where there is no such call."""
  if not sys.platform.startswith("linux"):
    return None
  try:
    libc = ctypes.CDLL(None, use_errno=True)
  except OSError:
    return None
  madvise = libc.madvise
  madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
  madvise.restype = ctypes.c_int
  return madvise


def _cpu_buffers(tree):
  """(address, bytes) of every CPU buffer under `tree`'s jax.Array leaves."""
  for leaf in jax.tree.leaves(tree):
    if not isinstance(leaf, jax.Array):
      continue
    for shard in leaf.addressable_shards:
      if shard.device.platform == "cpu" and shard.data.nbytes:
        yield shard.data.unsafe_buffer_pointer(), shard.data.nbytes


def pages_of(buffers):
  """The indices of the 2 MiB pages that (address, bytes) buffers touch."""
  pages = set()
  for address, size in buffers:
    pages.update(
        range(address // PAGE_BYTES, (address + size - 1) // PAGE_BYTES + 1)
    )
  return sorted(pages)


@gin.configurable(module="huge_pages")
def collapse(tree, enabled=True):
  """Moves the CPU memory under `tree`'s arrays onto 2 MiB pages.

  Args:
    tree: a pytree of jax.Arrays (parameters, placed); other leaves and
      buffers on other platforms are left alone.
    enabled: False leaves every page as it is.

  Returns:
    `tree`, the same arrays.
  """
  madvise = _madvise()
  if not enabled or madvise is None:
    return tree
  pages = pages_of(_cpu_buffers(tree))
  collapsed = 0
  for page in pages:
    if madvise(page * PAGE_BYTES, PAGE_BYTES, _MADV_COLLAPSE) == 0:
      collapsed += 1
    elif ctypes.get_errno() == errno.EINVAL:
      # This kernel has no MADV_COLLAPSE (before 6.1), or no huge pages.
      break
  if pages:
    logging.info("parameters on 2 MiB pages: %d of %d", collapsed, len(pages))
  return tree
