"""A Hugging Face checkpoint directory is enough to run, and nothing is wrong.

Directories saved by transformers (tests/hf_directories.py): the model config
comes from config.json (T5 1.0, T5 1.1, mT5; umT5 and LongT5 refused by
name), a gin size file is checked against it, T5Config.dtype='auto' takes the
stored dtype, `~` and environment variables are expanded, a file inside a
directory resolves, and a Flax msgpack loads. Logits are compared with
transformers' own.
"""

import copy
import json
import os
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from flax import serialization
from flax import traverse_util
import gin
import jax.numpy as jnp
import numpy as np
import torch

from spec_decode import checkpoints
from spec_decode import gin_config
from spec_decode import pair
from spec_decode.checkpoints import hf_config
from spec_decode.models import t5
import hf_directories

# float32 throughout; the two implementations sum in different orders.
_ATOL = 1e-4
_MT5_VOCAB = 250_112
# The T5Config each family's saved directory must give.
_EXPECTED = {
    "t5_1_0": t5.T5Config(
        vocab_size=64,
        emb_dim=16,
        num_heads=2,
        head_dim=4,
        mlp_dim=32,
        num_encoder_layers=2,
        num_decoder_layers=1,
        mlp_activations=("relu",),
        logits_via_embedding=True,
        num_buckets=8,
        max_distance=20,
    ),
}
_EXPECTED["t5_1_1"] = t5.T5Config(
    **dict(
        vars(_EXPECTED["t5_1_0"]),
        mlp_activations=("gelu", "linear"),
        logits_via_embedding=False,
    )
)
_EXPECTED["mt5"] = t5.T5Config(
    **dict(vars(_EXPECTED["t5_1_1"]), vocab_size=_MT5_VOCAB)
)
_INPUTS = np.array([[5, 9, 13, 2, 1], [7, 3, 1, 0, 0]], np.int32)
_TARGETS = np.array([[0, 4, 8, 12], [0, 6, 10, 14]], np.int32)


def _hf_logits(model):
  with torch.no_grad():
    return model(
        input_ids=torch.from_numpy(_INPUTS).long(),
        attention_mask=torch.from_numpy(_INPUTS > 0).long(),
        decoder_input_ids=torch.from_numpy(_TARGETS).long(),
    ).logits.numpy()


def _flat(params):
  return traverse_util.flatten_dict(params, sep="/")


class HfDirectoryTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    cls.models = {}
    for family in ("t5_1_0", "t5_1_1", "mt5", "umt5", "longt5"):
      vocab_size = _MT5_VOCAB if family == "mt5" else 64
      cls.models[family] = hf_directories.save_model(
          family, cls._dir(family), vocab_size
      )
    v11 = cls.models["t5_1_1"]
    v11.save_pretrained(cls._dir("sharded"), max_shard_size="2KB")
    copy.deepcopy(v11).to(torch.bfloat16).save_pretrained(cls._dir("bfloat16"))
    os.makedirs(cls._dir("torch"))
    torch.save(
        v11.state_dict(), os.path.join(cls._dir("torch"), "pytorch_model.bin")
    )
    for family in ("t5_1_1", "t5_1_0"):
      hf_directories.save_flax(cls.models[family], cls._dir(f"flax_{family}"))
    for name in ("torch", "flax_t5_1_1", "flax_t5_1_0"):
      family = "t5_1_0" if name.endswith("t5_1_0") else "t5_1_1"
      shutil.copy(os.path.join(cls._dir(family), "config.json"), cls._dir(name))

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root)
    super().tearDownClass()

  @classmethod
  def _dir(cls, name):
    return os.path.join(cls.root, name)

  def tearDown(self):
    gin.clear_config()
    super().tearDown()

  def _expected_params(self):
    """T5 1.1's parameters, read from its safetensors directory."""
    return checkpoints.load_params(
        self._dir("t5_1_1"), t5.param_shapes(_EXPECTED["t5_1_1"])
    )

  def _assert_same_params(self, params, expected):
    self.assertSameElements(_flat(params), _flat(expected))
    for name, array in _flat(expected).items():
      np.testing.assert_array_equal(_flat(params)[name], array, name)

  def _config(self, path, *bindings, files=()):
    gin_config.parse(
        files, [f"target/checkpoint_path.path = '{path}'", *bindings]
    )
    return pair.model_config("target")

  @parameterized.parameters("t5_1_0", "t5_1_1", "mt5")
  def test_directory_alone_gives_config_and_logits(self, family):
    config = self._config(self._dir(family))
    self.assertEqual(config, _EXPECTED[family])
    loaded = pair.load_model("target")
    logits = loaded.model.apply(
        {"params": loaded.params}, jnp.asarray(_INPUTS), jnp.asarray(_TARGETS)
    )
    expected = _hf_logits(self.models[family])
    self.assertGreater(np.abs(expected).max(), 1.0)
    np.testing.assert_allclose(logits, expected, rtol=0, atol=_ATOL)

  def test_t5_1_0_config_without_later_fields(self):
    # As t5-small's config.json: written before feed_forward_proj,
    # num_decoder_layers and relative_attention_max_distance existed (and,
    # once, under T5ForConditionalGeneration's old name).
    fields = hf_config.t5_fields(
        {
            "architectures": ["T5WithLMHeadModel"],
            "d_ff": 2048,
            "d_kv": 64,
            "d_model": 512,
            "num_heads": 8,
            "num_layers": 6,
            "relative_attention_num_buckets": 32,
            "vocab_size": 32128,
        },
        "t5-small",
    )
    self.assertEqual(fields["mlp_activations"], ("relu",))
    self.assertEqual(fields["num_decoder_layers"], 6)
    self.assertEqual(fields["max_distance"], 128)
    self.assertTrue(fields["logits_via_embedding"])

  @parameterized.parameters("t5", "mt5")
  def test_t5_1_1_config_of_transformers_4(self, model_type):
    # As transformers 4 wrote Flan-T5's and mT5's: tie_word_embeddings false
    # and no scale_decoder_outputs.
    fields = hf_config.t5_fields(
        {
            "architectures": [
                "MT5ForConditionalGeneration"
                if model_type == "mt5"
                else "T5ForConditionalGeneration"
            ],
            "d_ff": 1024,
            "d_kv": 64,
            "d_model": 512,
            "decoder_start_token_id": 0,
            "dense_act_fn": "gelu_new",
            "eos_token_id": 1,
            "feed_forward_proj": "gated-gelu",
            "is_gated_act": True,
            "layer_norm_epsilon": 1e-06,
            "model_type": model_type,
            "num_decoder_layers": 8,
            "num_heads": 6,
            "num_layers": 8,
            "pad_token_id": 0,
            "relative_attention_max_distance": 128,
            "relative_attention_num_buckets": 32,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "vocab_size": 250112 if model_type == "mt5" else 32128,
        },
        "config.json",
    )
    gin_config.parse(
        ["models/t5_1_1_small.gin"],
        [f"T5Config.vocab_size = {fields['vocab_size']}"],
    )
    self.assertEqual(t5.T5Config(**fields), t5.T5Config())

  def test_agreeing_size_file_is_accepted(self):
    config = self._config(
        self._dir("t5_1_1"),
        "target/T5Config.emb_dim = 16",
        "target/T5Config.mlp_activations = ['gelu', 'linear']",
        "target/T5Config.dropout_rate = 0.1",
    )
    self.assertEqual(config.dropout_rate, 0.1)
    self.assertEqual(config.emb_dim, 16)

  def test_disagreeing_bindings_are_one_line_naming_each_field(self):
    with self.assertRaises(ValueError) as raised:
      self._config(
          self._dir("t5_1_1"),
          "target/T5Config.mlp_activations = ('silu', 'linear')",
          "target/T5Config.max_distance = 128",
          "target/T5Config.emb_dim = 16",
      )
    message = str(raised.exception)
    self.assertNotIn("\n", message)
    self.assertIn(os.path.join(self._dir("t5_1_1"), "config.json"), message)
    self.assertIn(
        "mlp_activations ('silu', 'linear') (gin) != ('gelu', 'linear')",
        message,
    )
    self.assertIn("max_distance 128 (gin) != 20", message)
    self.assertNotIn("emb_dim", message)

  def test_size_file_of_another_model_is_refused(self):
    run_file = self._dir("mt5_with_size_file.gin")
    with open(run_file, "w") as f:
      f.write("include 'target:models/t5_1_1_small.gin'\n")
    with self.assertRaises(ValueError) as raised:
      self._config(self._dir("mt5"), files=[run_file])
    message = str(raised.exception)
    self.assertNotIn("\n", message)
    for field in ("vocab_size 32128 (gin) != 250112", "emb_dim 512", "mlp_dim"):
      self.assertIn(field, message)
    self.assertNotIn("mlp_activations", message)

  @parameterized.parameters(("umt5", "umT5"), ("longt5", "LongT5"))
  def test_unimplemented_family_is_refused_by_name(self, family, name):
    with self.assertRaises(ValueError) as raised:
      self._config(self._dir(family))
    message = str(raised.exception)
    self.assertNotIn("\n", message)
    self.assertIn(f"model_type '{family}' is {name}", message)

  @parameterized.named_parameters(
      ("exact_gelu", {"feed_forward_proj": "gelu"}, "'gelu' is not"),
      ("encoder_only", {"architectures": ["T5EncoderModel"]}, "T5EncoderModel"),
      ("bart", {"model_type": "bart"}, "'bart' is not a T5"),
      ("eos", {"eos_token_id": 2}, "eos_token_id is 2"),
      ("epsilon", {"layer_norm_epsilon": 1e-5}, "layer_norm_epsilon"),
  )
  def test_config_this_code_does_not_run_is_refused(self, change, expected):
    with open(os.path.join(self._dir("t5_1_1"), "config.json")) as f:
      config = json.load(f)
    config.update(change)
    with self.assertRaisesRegex(checkpoints.CheckpointFormatError, expected):
      hf_config.t5_fields(config, "config.json")

  def test_auto_dtype_is_the_stored_dtype(self):
    config = self._config(
        self._dir("bfloat16"), "target/T5Config.dtype = 'auto'"
    )
    self.assertEqual(config.dtype, "bfloat16")
    loaded = pair.load_model("target")
    for name, array in _flat(loaded.params).items():
      self.assertEqual(array.dtype, jnp.bfloat16, name)
    config = self._config(self._dir("t5_1_1"), "target/T5Config.dtype = 'auto'")
    self.assertEqual(config.dtype, "float32")

  def test_auto_dtype_of_a_t5x_checkpoint_is_refused(self):
    directory = self._dir("t5x")
    os.makedirs(directory, exist_ok=True)
    params = t5.init_params(_EXPECTED["t5_1_1"], jnp.zeros((2,), jnp.uint32))
    with open(os.path.join(directory, "checkpoint"), "wb") as f:
      f.write(serialization.msgpack_serialize({"target": params}))
    with self.assertRaisesRegex(ValueError, "Hugging Face checkpoints only"):
      self._config(
          directory,
          "target/T5Config.vocab_size = 64",
          "target/T5Config.dtype = 'auto'",
      )

  @parameterized.parameters(
      "~/t5_1_1", "$CKPT_ROOT/t5_1_1", "${CKPT_ROOT}/t5_1_1"
  )
  def test_home_and_environment_variables_are_expanded(self, path):
    with mock.patch.dict(
        os.environ, {"HOME": self.root, "CKPT_ROOT": self.root}
    ):
      self.assertEqual(self._config(path), _EXPECTED["t5_1_1"])
      loaded = pair.load_model("target")
    self._assert_same_params(loaded.params, self._expected_params())

  def test_unset_environment_variable_is_named(self):
    with mock.patch.dict(os.environ):
      os.environ.pop("NO_SUCH_ROOT", None)
      with self.assertRaisesRegex(
          ValueError, "environment variable NO_SUCH_ROOT is not set"
      ):
        self._config("$NO_SUCH_ROOT/t5_1_1")

  @parameterized.parameters(
      ("sharded", "model.safetensors.index.json"),
      ("sharded", "model-00002-of-{count}.safetensors"),
      ("t5_1_1", "config.json"),
      ("t5_1_1", "model.safetensors"),
      ("torch", "pytorch_model.bin"),
      ("flax_t5_1_1", "flax_model.msgpack"),
  )
  def test_file_inside_directory_resolves(self, name, file_name):
    directory = self._dir(name)
    count = len([f for f in os.listdir(directory) if f.startswith("model-")])
    path = os.path.join(directory, file_name.format(count=f"{count:05d}"))
    self.assertTrue(os.path.isfile(path), path)
    self.assertEqual(self._config(path), _EXPECTED["t5_1_1"])
    loaded = pair.load_model("target")
    self._assert_same_params(loaded.params, self._expected_params())

  @parameterized.parameters("t5_1_1", "t5_1_0")
  def test_flax_msgpack_gives_transformers_logits(self, family):
    self._config(self._dir(f"flax_{family}"))
    loaded = pair.load_model("target")
    logits = loaded.model.apply(
        {"params": loaded.params}, jnp.asarray(_INPUTS), jnp.asarray(_TARGETS)
    )
    np.testing.assert_allclose(
        logits, _hf_logits(self.models[family]), rtol=0, atol=_ATOL
    )

  def test_sharded_flax_is_refused_by_name(self):
    directory = self._dir("flax_sharded")
    os.makedirs(directory)
    with open(
        os.path.join(directory, "flax_model.msgpack.index.json"), "w"
    ) as f:
      json.dump({"weight_map": {}}, f)
    with self.assertRaisesRegex(
        checkpoints.CheckpointFormatError, "sharded Hugging Face Flax"
    ):
      checkpoints.load_params(directory, t5.param_shapes(_EXPECTED["t5_1_1"]))
    # Beside other weights, as Hub repositories have it: those are read.
    shutil.copy(
        os.path.join(self._dir("t5_1_1"), "model.safetensors"), directory
    )
    self._assert_same_params(
        checkpoints.load_params(
            directory, t5.param_shapes(_EXPECTED["t5_1_1"])
        ),
        self._expected_params(),
    )

  def test_flax_msgpack_of_something_else_is_named(self):
    directory = self._dir("flax_other")
    os.makedirs(directory)
    with open(os.path.join(directory, "flax_model.msgpack"), "wb") as f:
      f.write(serialization.msgpack_serialize({"w": np.zeros(3, np.float32)}))
    with self.assertRaisesRegex(
        checkpoints.CheckpointFormatError,
        "not a Hugging Face Flax T5 checkpoint",
    ):
      checkpoints.load_params(directory, t5.param_shapes(_EXPECTED["t5_1_1"]))


if __name__ == "__main__":
  absltest.main()
