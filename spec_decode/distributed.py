"""Multi-host set-up: jax.distributed, inputs per host, outputs on host 0.

On a Cloud TPU slice with several hosts, every host runs the same command
(`gcloud ... ssh --worker=all`), and `jax.distributed.initialize()` finds its
peers from the TPU metadata. Elsewhere (GPU clusters, the tests' localhost
processes) the coordinator, the process count and this process's id are
given explicitly.
"""

import gin
import jax


@gin.configurable
def initialize_distributed(
    enabled=False, coordinator_address=None, num_processes=None, process_id=None
):
  """Calls `jax.distributed.initialize` when `enabled`.

  Must run before anything touches a JAX device.

  Args:
    enabled: False runs on this host's devices alone.
    coordinator_address: 'host:port' of process 0; None lets JAX detect it
      (Cloud TPU, SLURM).
    num_processes: processes in the job; None to detect.
    process_id: this process's index; None to detect.
  """
  if not enabled:
    return
  jax.distributed.initialize(
      coordinator_address=coordinator_address,
      num_processes=num_processes,
      process_id=process_id,
  )
