"""One process of checkpoints_test.HostMemoryTest: writes or loads a T5X file.

Usage:
  python host_memory_worker.py write DIRECTORY  # random float32 weights
  python host_memory_worker.py load DIRECTORY   # prints a JSON line

`load` prints the resident set size before the load and the peak during it
(VmHWM), in bytes, with the parameters' total and largest
sizes, so that the test can hold the peak to one copy of the parameters.
"""

import json
import os
import sys

from flax import serialization
from flax import traverse_util
import jax
import numpy as np

from spec_decode import checkpoints
from spec_decode.models import t5

# 1.13 GB of float32 weights in 50 tensors, the largest 132 MB (the token
# embedding and the logits layer).
CONFIG = t5.T5Config(
    vocab_size=32128,
    emb_dim=1024,
    num_heads=16,
    head_dim=64,
    mlp_dim=4096,
    num_encoder_layers=6,
    num_decoder_layers=6,
)


def _status_bytes(field):
  """A memory figure of this process from /proc/self/status, in bytes.

  VmHWM, the peak resident set, belongs to the process's own memory map. (Not
  ru_maxrss: Linux keeps that across exec, so a child of a large pytest
  process would report its parent's size.)

  Args:
    field: "VmRSS" (now) or "VmHWM" (the peak so far).
  """
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) * 1024
  raise ValueError(f"No {field} in /proc/self/status.")


def write(directory):
  """Writes {'optimizer': {'target': params}} as one msgpack file."""
  rng = np.random.default_rng(0)
  flat = traverse_util.flatten_dict(t5.param_shapes(CONFIG), sep="/")
  params = {
      name: rng.standard_normal(leaf.shape, np.float32)
      for name, leaf in flat.items()
  }
  state = {"optimizer": {"target": traverse_util.unflatten_dict(params, "/")}}
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "checkpoint"), "wb") as f:
    f.write(serialization.msgpack_serialize(state))


def load(directory):
  """Loads the checkpoint in float32; prints the memory figures as JSON."""
  expected = t5.param_shapes(CONFIG)
  jax.devices()  # The backend's own memory, before the baseline.
  before = _status_bytes("VmRSS")
  params = checkpoints.load_params(directory, expected)
  peak = _status_bytes("VmHWM")
  sizes = [leaf.nbytes for leaf in jax.tree.leaves(params)]
  print(
      json.dumps(
          dict(
              rss_before=before,
              peak=peak,
              total=sum(sizes),
              largest=max(sizes),
          )
      )
  )


if __name__ == "__main__":
  {"write": write, "load": load}[sys.argv[1]](sys.argv[2])
