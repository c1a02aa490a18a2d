"""One process of checkpoints_test.HostMemoryTest: writes or loads a T5X file.

Usage:
  python host_memory_worker.py write DIRECTORY  # random float32 weights
  python host_memory_worker.py load DIRECTORY   # prints a JSON line

`load` prints the resident set size before the load and the peak during it
(ru_maxrss, whole process), in bytes, with the parameters' total and largest
sizes, so that the test can hold the peak to one copy of the parameters.
"""

import json
import os
import resource
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


def _rss_bytes():
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


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
  before = _rss_bytes()
  params = checkpoints.load_params(directory, expected)
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
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
