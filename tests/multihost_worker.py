"""One process of tests/multihost_test.py: 4 CPU devices of a 2-host mesh.

Usage: python multihost_worker.py PORT PROCESS_ID OUTPUT.npz
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np

from spec_decode import distributed
import partitioning_test

# pylint: enable=g-import-not-at-top,wrong-import-position


def main(port, process_id, output):
  distributed.initialize_distributed(
      enabled=True,
      coordinator_address=f"localhost:{port}",
      num_processes=2,
      process_id=process_id,
  )
  assert jax.device_count() == 8 and jax.local_device_count() == 4
  params, draft_params = partitioning_test.random_params()
  decoders = partitioning_test.make_engine((2, 4), params, draft_params)
  assert dict(decoders.mesh.shape) == {"data": 2, "model": 4}
  outputs = partitioning_test.decode(decoders, partitioning_test.inputs())
  if jax.process_index() == 0:
    np.savez(
        output,
        **{
            f"{name}_{temperature}": sequences
            for temperature, pair in outputs.items()
            for name, sequences in zip(("baseline", "speculative"), pair)
        },
    )


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
