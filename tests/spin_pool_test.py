"""spec_decode/kernels/spin_pool.h: the few-rows kernel's worker threads.

tests/spin_pool_harness.cc drives a Pool directly (compiled here with the
compiler the kernel uses): many short jobs, each on the caller's stack, to
catch a worker that touches a job after Run returned or a piece done twice or
never; and jobs started while the workers sleep, which the caller must finish
without waiting for them to wake.
"""

import pathlib
import subprocess
import tempfile

from absl.testing import absltest

from spec_decode.kernels import library

_KERNELS = (
    pathlib.Path(__file__).resolve().parent.parent / "spec_decode" / "kernels"
)
_HARNESS = pathlib.Path(__file__).resolve().with_name("spin_pool_harness.cc")


def _counts(line):
  """'jobs 20 on_workers 0 stale 0' -> {'jobs': 20, ...}."""
  words = line.split()
  return {k: int(v) for k, v in zip(words[::2], words[1::2])}


class SpinPoolTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    compiler = library.compiler()
    if not compiler:
      raise absltest.SkipTest("no C++ compiler")
    cls._scratch = tempfile.TemporaryDirectory()
    cls._binary = pathlib.Path(cls._scratch.name) / "spin_pool_harness"
    subprocess.run(
        [compiler, "-O2", "-std=c++17", "-pthread", f"-I{_KERNELS}"]
        + [str(_HARNESS), "-o", str(cls._binary)],
        check=True,
        capture_output=True,
        timeout=120,
    )

  @classmethod
  def tearDownClass(cls):
    cls._scratch.cleanup()
    super().tearDownClass()

  def _run(self, mode):
    # A hang (a joined count that never returns to 0) fails by the timeout.
    done = subprocess.run(
        [str(self._binary), mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
    return _counts(done.stdout)

  def test_every_piece_once_and_no_worker_after_run_returns(self):
    counts = self._run("stress")
    self.assertEqual(counts["jobs"], 200000)
    self.assertEqual(counts["wrong"], 0)
    self.assertEqual(counts["stale"], 0)

  def test_the_caller_does_not_wait_for_sleeping_workers(self):
    # Each one-piece job starts 10 ms after the last (the workers asleep by
    # then); its caller's share takes well under a microsecond, a worker's
    # wake-up tens of microseconds. A pool whose caller waits for every
    # worker counts all 20 jobs as run on a worker. This one ran 0 of 20 on
    # an idle machine and 3 of 20 with three busy threads on its 2 cores; a
    # worker joins only where the caller is preempted before its share ends.
    counts = self._run("asleep")
    self.assertEqual(counts["jobs"], 20)
    self.assertLess(counts["on_workers"], 15)
    self.assertEqual(counts["stale"], 0)


if __name__ == "__main__":
  absltest.main()
