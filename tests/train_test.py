"""Tests for training: the loss, optimizers, the loop, checkpoints, export.

The loop trains on a distillation task built from the Multi30k test files
shipped in spec_decode/demo/, so it runs from a fresh clone.
"""

import dataclasses
import functools
import json
import os
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import gin
import jax
import jax.numpy as jnp
import numpy as np

import fake_models
from spec_decode import checkpoints
from spec_decode import data
from spec_decode import gin_config
from spec_decode import optimizers
from spec_decode import train_checkpoints
from spec_decode import train_loop
from spec_decode import training
from spec_decode.models import t5
from spec_decode.models.config import T5Config

# The demo vocabulary with the smallest model that still has every part.
TINY = fake_models.tiny_t5(4096)
_MULTI30K_TEST = data.DEMO_DIR / "multi30k"


def _tempdir(test):
  directory = tempfile.TemporaryDirectory()
  test.addCleanup(directory.cleanup)
  return directory.name


def _assert_trees_equal(test, actual, expected):
  test.assertEqual(jax.tree.structure(actual), jax.tree.structure(expected))
  jax.tree.map(np.testing.assert_array_equal, actual, expected)


class CrossEntropyTest(absltest.TestCase):

  def test_matches_numpy(self):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
    targets = rng.integers(0, 5, size=(2, 3)).astype(np.int32)
    weights = np.array([[1, 1, 0], [1, 0, 0]], np.int32)
    loss, z_term, correct = training.cross_entropy(
        logits, targets, weights, z_loss=0.1
    )
    log_z = np.log(np.exp(logits).sum(-1))
    nll = log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(
        loss, ((nll + 0.1 * log_z**2) * weights).sum(), rtol=1e-5
    )
    np.testing.assert_allclose(
        z_term, (0.1 * log_z**2 * weights).sum(), rtol=1e-5
    )
    self.assertEqual(correct, ((logits.argmax(-1) == targets) * weights).sum())


class SchedulesTest(absltest.TestCase):

  def test_warmup_rsqrt(self):
    schedule = optimizers.warmup_rsqrt(peak=0.01, warmup_steps=100)
    np.testing.assert_allclose(
        [schedule(s) for s in (0, 50, 100, 400)],
        [1e-4, 5e-3, 1e-2, 5e-3],
        rtol=1e-6,
    )

  def test_warmup_cosine(self):
    schedule = optimizers.warmup_cosine(
        peak=1e-3, warmup_steps=10, total_steps=110
    )
    np.testing.assert_allclose(
        [schedule(s) for s in (0, 10, 60, 110)],
        [0.0, 1e-3, 5.5e-4, 1e-4],
        rtol=1e-5,
        atol=1e-9,
    )


class TrainStepTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("adamw", lambda: optimizers.adamw(3e-3)),
      (
          "adafactor",
          lambda: optimizers.adafactor(
              optimizers.warmup_rsqrt(peak=0.03, warmup_steps=10)
          ),
      ),
  )
  def test_overfits_one_batch(self, make_optimizer):
    config = dataclasses.replace(TINY, vocab_size=32)
    rng = np.random.default_rng(0)
    targets = rng.integers(3, 32, size=(4, 6)).astype(np.int32)
    batch = {
        "encoder_input_tokens": rng.integers(3, 32, (4, 7)).astype(np.int32),
        "decoder_target_tokens": targets,
        "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
        "decoder_loss_weights": np.ones((4, 6), np.int32),
    }
    optimizer = make_optimizer()
    state = training.init_state(config, optimizer, jax.random.key(0))
    step = jax.jit(
        functools.partial(
            training.train_step,
            model=t5.Transformer(config),
            optimizer=optimizer,
            dropout_seed=0,
            z_loss=training.Z_LOSS,
        )
    )
    losses = []
    for _ in range(60):
      state, metrics = step(state, batch)
      losses.append(float(metrics["loss"]))
    self.assertEqual(int(state.step), 60)
    self.assertLess(losses[-1], 0.3 * losses[0])


class TrainLoopTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    # A 'train' split of the shipped files: no ../shared needed.
    self.task = data.distillation_task(
        target_file=_MULTI30K_TEST / "test_2016_flickr.de.gz",
        source_file=_MULTI30K_TEST / "test_2016_flickr.en.gz",
        name="train_test_task",
    )
    self.model_dir = os.path.join(_tempdir(self), "model")

  def _train(self, num_steps, **kwargs):
    settings = dict(
        model_dir=self.model_dir,
        task=self.task,
        num_steps=num_steps,
        batch_size=8,
        feature_lengths={"inputs": 32, "targets": 32},
        optimizer=optimizers.adamw(1e-3),
        eval_task=data.MULTI30K,
        eval_split="test",
        eval_every=2,
        checkpoint_every=2,
        log_every=1,
    )
    return train_loop.train(TINY, **(settings | kwargs))

  def _metrics(self):
    with open(os.path.join(self.model_dir, "metrics.jsonl")) as f:
      return [json.loads(line) for line in f]

  def test_checkpoint_resume_and_export(self):
    state = self._train(4)
    self.assertEqual(int(state.step), 4)
    self.assertEqual(
        sorted(os.listdir(self.model_dir)),
        ["checkpoint_2", "checkpoint_4", "config.gin", "metrics.jsonl"],
    )
    evals = [m for m in self._metrics() if "eval_loss" in m]
    self.assertEqual([m["step"] for m in evals], [2, 4])
    self.assertTrue(all(np.isfinite(m["eval_loss"]) for m in evals))
    self.assertGreater(evals[0]["eval_tokens"], 15_000)

    # Restored from disk into a differently seeded init: step 4's state.
    manager = train_checkpoints.manager(self.model_dir)
    restored = train_checkpoints.restore_latest(
        manager,
        training.init_state(TINY, optimizers.adamw(1e-3), jax.random.key(1)),
    )
    manager.close()
    self.assertEqual(int(restored.step), 4)
    _assert_trees_equal(self, restored.params, state.params)
    _assert_trees_equal(self, restored.opt_state, state.opt_state)

    # A run to step 4 resumes there and has nothing left to do.
    resumed = self._train(4)
    self.assertEqual(int(resumed.step), 4)
    _assert_trees_equal(self, resumed.params, state.params)
    # A longer run continues from step 4.
    longer = self._train(6, export_dir=os.path.join(self.model_dir, "export"))
    self.assertEqual(int(longer.step), 6)
    self.assertEqual(
        [m["step"] for m in self._metrics() if "loss" in m], [1, 2, 3, 4, 5, 6]
    )

    # Both the training checkpoint and the export load as params.
    expected = t5.param_shapes(TINY)
    latest = train_checkpoints.latest_checkpoint(self.model_dir)
    self.assertEqual(os.path.basename(latest), "checkpoint_6")
    _assert_trees_equal(
        self, checkpoints.load_params(latest, expected), longer.params
    )
    exported = checkpoints.load_params(
        os.path.join(self.model_dir, "export"), expected
    )
    _assert_trees_equal(self, exported, longer.params)
    tokens = jnp.ones((1, 5), jnp.int32)
    logits = t5.Transformer(TINY).apply({"params": exported}, tokens, tokens)
    self.assertEqual(logits.shape, (1, 5, 4096))
    self.assertTrue(np.all(np.isfinite(logits)))

  def test_ctrl_c_saves_the_last_step_and_resumes_there(self):
    log = train_loop._log_train_metrics  # pylint: disable=protected-access

    def log_then_stop(metrics_file, step, *args):
      since = log(metrics_file, step, *args)
      if step == 3:  # Saved at 2 (checkpoint_every); 3 is not.
        raise KeyboardInterrupt
      return since

    with mock.patch.object(train_loop, "_log_train_metrics", log_then_stop):
      with self.assertRaises(KeyboardInterrupt) as caught:
        self._train(4)
    directory = os.path.abspath(self.model_dir)
    self.assertEqual(
        caught.exception.args,
        (
            f"at step 3, saved as checkpoint_3 in {directory}: the same "
            "command resumes there",
        ),
    )
    self.assertEqual(
        os.path.basename(train_checkpoints.latest_checkpoint(self.model_dir)),
        "checkpoint_3",
    )
    self.assertEqual(int(self._train(4).step), 4)
    self.assertEqual(
        [m["step"] for m in self._metrics() if "loss" in m], [1, 2, 3, 4]
    )

  def test_ctrl_c_inside_a_step_saves_nothing_it_lost(self):
    make_steps = train_loop._step_functions  # pylint: disable=protected-access

    def steps_that_stop_at_3(*args):
      step_fn, eval_fn = make_steps(*args)

      def step_then_stop(state, batch):
        new_state, metrics = step_fn(state, batch)  # Donates `state`.
        if int(new_state.step) == 3:
          raise KeyboardInterrupt
        return new_state, metrics

      return step_then_stop, eval_fn

    with mock.patch.object(train_loop, "_step_functions", steps_that_stop_at_3):
      with self.assertRaises(KeyboardInterrupt) as caught:
        self._train(4)
    self.assertEqual(
        caught.exception.args,
        (
            "during a step, which was not saved; "
            f"{os.path.abspath(self.model_dir)} has checkpoint_2",
        ),
    )

  def test_bad_settings_fail_before_any_work(self):
    taken = _tempdir(self)
    for kwargs, message in (
        (dict(num_steps=0), "train.num_steps must be an int >= 1, got 0"),
        (dict(num_steps=4, seed="0"), "train.seed must be an int, got '0'"),
        (
            dict(num_steps=4, optimizer=None),
            "train.optimizer must be an optax.GradientTransformation",
        ),
        (
            dict(num_steps=4, export_dtype="bf16"),
            r"train.export_dtype must be one of \('float32', 'bfloat16'\), "
            "got 'bf16'",
        ),
        (
            dict(num_steps=4, feature_lengths={"inputs": 0, "targets": 32}),
            r"train.feature_lengths\['inputs'\] must be an int >= 1, got 0",
        ),
        (
            dict(num_steps=4, eval_split="valid"),
            "seqio task multi30k_en_de has no split 'valid' \\(it has train, "
            "validation, test\\)",
        ),
        (
            dict(num_steps=4, export_dir=taken),
            f"train.export_dir {taken} exists: the export writes a new "
            "directory",
        ),
    ):
      with self.subTest(message=message):
        with self.assertRaisesRegex(ValueError, f"^{message}"):
          self._train(**kwargs)
        self.assertFalse(os.path.exists(self.model_dir))

  def test_export_bfloat16(self):
    params = t5.init_params(TINY, jax.random.key(0))
    path = os.path.join(_tempdir(self), "export")
    train_checkpoints.export_params(params, path, jnp.bfloat16)
    loaded = checkpoints.load_params(path, t5.param_shapes(TINY), jnp.bfloat16)
    _assert_trees_equal(
        self,
        loaded,
        jax.tree.map(lambda x: np.asarray(x.astype(jnp.bfloat16)), params),
    )


class TrainConfigsTest(parameterized.TestCase):

  def tearDown(self):
    gin.clear_config()
    super().tearDown()

  @parameterized.named_parameters(
      ("target", "train/multi30k_target.gin", 9_000_000, 10_000_000),
      ("draft", "train/multi30k_draft.gin", 1_500_000, 2_500_000),
      (
          "draft_distill",
          "train/multi30k_draft_distill.gin",
          1_500_000,
          2_500_000,
      ),
  )
  def test_parses(self, path, min_params, max_params):
    gin_config.parse([path], ["TARGET_OUTPUTS = 'outputs.de'"])
    config = T5Config()
    self.assertEqual(config.vocab_size, data.vocabulary().vocab_size)
    self.assertBetween(t5.num_params(config), min_params, max_params)
    self.assertEqual(gin.query_parameter("train.batch_size"), 64)
    self.assertGreater(gin.query_parameter("%NUM_STEPS"), 0)


if __name__ == "__main__":
  absltest.main()
