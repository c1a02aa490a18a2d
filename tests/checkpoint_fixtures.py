"""Checkpoints for the tests of spec_decode.checkpoints.

t5x's tiny test checkpoint in tests/testdata (see PROVENANCE.md there) and
its architecture, a smaller T5 for the checkpoints the tests write
themselves, and the helpers that write and read them.
"""

import os
import shutil
import tempfile

from flax import serialization
from flax import traverse_util
import jax
import numpy as np

from spec_decode.models import t5
from spec_decode.models.config import T5Config

TESTDATA = os.path.join(os.path.dirname(__file__), "testdata")
TINY_CHECKPOINT = os.path.join(TESTDATA, "test_t5_tiny.checkpoint_0")
# The architecture of test_t5_tiny.checkpoint_0 (configs/models/t5_1_1_tiny).
TINY = T5Config(
    vocab_size=32128,
    emb_dim=8,
    num_heads=4,
    head_dim=3,
    mlp_dim=16,
    num_encoder_layers=2,
    num_decoder_layers=2,
    mlp_activations=("gelu", "linear"),
    logits_via_embedding=False,
)
# A smaller T5 for checkpoints the tests write themselves.
SMALL = T5Config(
    vocab_size=64,
    emb_dim=8,
    num_heads=2,
    head_dim=4,
    mlp_dim=16,
    num_encoder_layers=1,
    num_decoder_layers=1,
)


def flat(tree):
  return traverse_util.flatten_dict(tree, sep="/")


def small_params():
  params = t5.init_params(SMALL, jax.random.key(0))
  return jax.tree.map(np.asarray, params)


def tempdir(test):
  """A fresh directory, removed after `test` (absl's needs parsed flags)."""
  directory = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, directory)
  return directory


def write_msgpack(directory, state):
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "checkpoint"), "wb") as f:
    f.write(serialization.msgpack_serialize(state))
  return directory
