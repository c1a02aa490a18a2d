"""Test set-up: 8 simulated CPU devices, for the sharding tests.

XLA reads the flag once, when JAX's CPU backend starts, so it is set here,
before any test module imports JAX. Tests that do not shard run on device 0.
"""

import os

_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"
if _DEVICES_FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(
      filter(None, [os.environ.get("XLA_FLAGS"), _DEVICES_FLAG])
  )
