"""Tests for loading Hugging Face T5 checkpoints into the t5x tree.

Tiny random `transformers.T5ForConditionalGeneration` models (T5 1.1 with
gated GELU and its own lm_head; T5 1.0 with ReLU and tied embeddings) are
saved as safetensors, sharded safetensors and pytorch_model.bin. The expected
t5x tree is built from the torch modules' attributes, independently of the
name table in spec_decode/checkpoints/hf.py.
"""

import dataclasses
import os
import shutil
import sys
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from flax import traverse_util
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from spec_decode import checkpoints
from spec_decode.models import t5
from spec_decode.models.config import T5Config
import hf_reference

_V11 = T5Config(
    vocab_size=64,
    emb_dim=8,
    num_heads=2,
    head_dim=4,
    mlp_dim=16,
    num_encoder_layers=2,
    num_decoder_layers=2,
    mlp_activations=("gelu", "linear"),
    logits_via_embedding=False,
)
_V10 = T5Config(
    vocab_size=64,
    emb_dim=8,
    num_heads=2,
    head_dim=4,
    mlp_dim=16,
    num_encoder_layers=2,
    num_decoder_layers=1,
    mlp_activations=("relu",),
    logits_via_embedding=True,
)
_CONFIGS = {"v1_1": _V11, "v1_0": _V10}


def _hf_model(config):
  """A random HF T5 of `config`; T5 1.1 gets an lm_head of its own."""
  return hf_reference.hf_model(config)


def _numpy(tensor):
  return tensor.detach().numpy()


def _expected_tree(model, config):
  """The t5x tree, read off the HF modules' attributes."""
  tree = {"token_embedder/embedding": _numpy(model.shared.weight)}
  if not config.logits_via_embedding:
    tree["decoder/logits_dense/kernel"] = _numpy(model.lm_head.weight).T
  mlp = (
      ["wi_0", "wi_1", "wo"]
      if config.mlp_activations == ("gelu", "linear")
      else ["wi", "wo"]
  )

  def attention(prefix, module):
    for hf, ours in (
        ("q", "query"),
        ("k", "key"),
        ("v", "value"),
        ("o", "out"),
    ):
      tree[f"{prefix}/{ours}/kernel"] = _numpy(getattr(module, hf).weight).T

  def dense(prefix, module):
    for name in mlp:
      tree[f"{prefix}/{name}/kernel"] = _numpy(getattr(module, name).weight).T

  for stack_name in ("encoder", "decoder"):
    stack = getattr(model, stack_name)
    tree[f"{stack_name}/relpos_bias/rel_embedding"] = _numpy(
        stack.block[0].layer[0].SelfAttention.relative_attention_bias.weight
    ).T
    tree[f"{stack_name}/{stack_name}_norm/scale"] = _numpy(
        stack.final_layer_norm.weight
    )
    for i, block in enumerate(stack.block):
      p = f"{stack_name}/layers_{i}"
      if stack_name == "encoder":
        attention(f"{p}/attention", block.layer[0].SelfAttention)
        tree[f"{p}/pre_attention_layer_norm/scale"] = _numpy(
            block.layer[0].layer_norm.weight
        )
        dense(f"{p}/mlp", block.layer[1].DenseReluDense)
        tree[f"{p}/pre_mlp_layer_norm/scale"] = _numpy(
            block.layer[1].layer_norm.weight
        )
      else:
        attention(f"{p}/self_attention", block.layer[0].SelfAttention)
        tree[f"{p}/pre_self_attention_layer_norm/scale"] = _numpy(
            block.layer[0].layer_norm.weight
        )
        attention(
            f"{p}/encoder_decoder_attention", block.layer[1].EncDecAttention
        )
        tree[f"{p}/pre_cross_attention_layer_norm/scale"] = _numpy(
            block.layer[1].layer_norm.weight
        )
        dense(f"{p}/mlp", block.layer[2].DenseReluDense)
        tree[f"{p}/pre_mlp_layer_norm/scale"] = _numpy(
            block.layer[2].layer_norm.weight
        )
  return tree


class HfCheckpointTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    cls.models = {}
    for version, config in _CONFIGS.items():
      model = _hf_model(config)
      cls.models[version] = model
      model.save_pretrained(os.path.join(cls.root, version, "safetensors"))
      model.save_pretrained(
          os.path.join(cls.root, version, "sharded"), max_shard_size="2KB"
      )
      torch_dir = os.path.join(cls.root, version, "torch")
      os.makedirs(torch_dir)
      # The pre-safetensors format: a torch.save'd state dict, in which tied
      # tensors (shared, embed_tokens, T5 1.0's lm_head) share storage.
      torch.save(
          model.state_dict(), os.path.join(torch_dir, "pytorch_model.bin")
      )

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root)
    super().tearDownClass()

  def _path(self, version, layout):
    return os.path.join(self.root, version, layout)

  def test_saved_files(self):
    self.assertTrue(
        os.path.isfile(
            os.path.join(
                self._path("v1_1", "sharded"), "model.safetensors.index.json"
            )
        )
    )
    v11 = self.models["v1_1"]
    self.assertFalse(v11.config.scale_decoder_outputs)
    self.assertFalse(torch.equal(v11.lm_head.weight, v11.shared.weight))
    self.assertTrue(self.models["v1_0"].config.scale_decoder_outputs)

  @parameterized.product(
      version=["v1_1", "v1_0"],
      layout=["safetensors", "sharded", "torch"],
  )
  def test_tree_equals_hf_weights(self, version, layout):
    config = _CONFIGS[version]
    params = checkpoints.load_params(
        self._path(version, layout), t5.param_shapes(config)
    )
    loaded = traverse_util.flatten_dict(params, sep="/")
    expected = _expected_tree(self.models[version], config)
    self.assertSameElements(loaded, expected)
    for name, array in loaded.items():
      self.assertEqual(array.dtype, jnp.float32, name)
      np.testing.assert_array_equal(array, expected[name], name)

  def test_weight_file_path_and_bfloat16(self):
    path = os.path.join(self._path("v1_1", "safetensors"), "model.safetensors")
    params = checkpoints.load_params(
        path, t5.param_shapes(_V11), dtype=jnp.bfloat16
    )
    expected = _expected_tree(self.models["v1_1"], _V11)
    for name, array in traverse_util.flatten_dict(params, sep="/").items():
      self.assertEqual(array.dtype, jnp.bfloat16, name)
      np.testing.assert_array_equal(
          array, expected[name].astype(jnp.bfloat16), name
      )

  @parameterized.parameters("v1_1", "v1_0")
  def test_logits_match_transformers(self, version):
    config = _CONFIGS[version]
    params = checkpoints.load_params(
        self._path(version, "safetensors"), t5.param_shapes(config)
    )
    inputs = np.array([[5, 9, 13, 2, 1], [7, 3, 1, 0, 0]], np.int32)
    targets = np.array([[0, 4, 8, 12], [0, 6, 10, 14]], np.int32)
    logits = t5.Transformer(config).apply(
        {"params": params}, jnp.asarray(inputs), jnp.asarray(targets)
    )
    with torch.no_grad():
      hf_logits = self.models[version](
          input_ids=torch.from_numpy(inputs).long(),
          attention_mask=torch.from_numpy(inputs > 0).long(),
          decoder_input_ids=torch.from_numpy(targets).long(),
      ).logits
    np.testing.assert_allclose(
        np.asarray(logits), hf_logits.numpy(), rtol=0, atol=1e-4
    )

  def test_untied_lm_head_does_not_fit_t5_1_0(self):
    config = dataclasses.replace(_V11, logits_via_embedding=True)
    with self.assertRaises(checkpoints.CheckpointMismatchError) as raised:
      checkpoints.load_params(
          self._path("v1_1", "safetensors"), t5.param_shapes(config)
      )
    message = str(raised.exception)
    self.assertIn("unexpected: decoder/logits_dense/kernel [8, 64]", message)
    self.assertIn("lm_head.weight differs from shared.weight", message)

  def test_missing_hf_tensor_is_listed(self):
    config = dataclasses.replace(_V11, num_encoder_layers=3)
    with self.assertRaises(checkpoints.CheckpointMismatchError) as raised:
      checkpoints.load_params(
          self._path("v1_1", "sharded"), t5.param_shapes(config)
      )
    self.assertIn(
        "missing: encoder/layers_2/attention/query/kernel [8, 8]",
        str(raised.exception),
    )

  @parameterized.parameters(
      "model.safetensors", "pytorch_model.bin", "model.safetensors.index.json"
  )
  def test_corrupt_file(self, name):
    directory = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, directory)
    with open(os.path.join(directory, name), "wb") as f:
      f.write(b"not a checkpoint" * 4)
    with self.assertRaises(checkpoints.CheckpointFormatError):
      checkpoints.load_params(directory, t5.param_shapes(_V11))

  def test_torch_file_without_torch(self):
    with mock.patch.dict(sys.modules, {"torch": None}):
      with self.assertRaisesRegex(
          checkpoints.CheckpointFormatError, "torch is not installed"
      ):
        checkpoints.load_params(
            self._path("v1_0", "torch"), t5.param_shapes(_V10)
        )


if __name__ == "__main__":
  absltest.main()
