"""Two processes on localhost, 4 CPU devices each, decode on one (2, 4) mesh.

Each process runs tests/multihost_worker.py: jax.distributed over a local
coordinator, the parameters placed shard by shard, inputs fed per host, and
the outputs (replicated) written by process 0. They must equal the tokens of
one process on one device.
"""

import os
import socket
import subprocess
import sys
import tempfile

from absl.testing import absltest
import numpy as np

import partitioning_test

_WORKER = os.path.join(os.path.dirname(__file__), "multihost_worker.py")
_TIMEOUT_SECONDS = 600


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


class MultiHostTest(absltest.TestCase):

  def test_two_processes_match_one_device(self):
    output = os.path.join(tempfile.mkdtemp(), "outputs.npz")
    port = _free_port()
    env = dict(os.environ)
    tests = os.path.dirname(os.path.abspath(__file__))
    # This checkout's spec_decode, not an installed one.
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [os.path.dirname(tests), tests, env.get("PYTHONPATH")])
    )
    workers = [
        subprocess.Popen(
            [sys.executable, _WORKER, str(port), str(i), output],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = [w.communicate(timeout=_TIMEOUT_SECONDS)[0] for w in workers]
    for worker, log in zip(workers, logs):
      self.assertEqual(worker.returncode, 0, log[-3000:])

    params, draft_params = partitioning_test.random_params()
    reference = partitioning_test.decode(
        partitioning_test.make_engine((1, 1), params, draft_params),
        partitioning_test.inputs(),
    )
    with np.load(output) as got:
      for temperature, pair in reference.items():
        for name, sequences in zip(("baseline", "speculative"), pair):
          np.testing.assert_array_equal(
              got[f"{name}_{temperature}"], sequences, f"{name} {temperature}"
          )


if __name__ == "__main__":
  absltest.main()
