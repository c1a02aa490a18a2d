"""Tests for distilling a draft from a teacher's distributions (DistillSpec)."""

import dataclasses
import functools
import json
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import gin
import jax
import numpy as np

import fake_models
from spec_decode import data
from spec_decode import distillation
from spec_decode import gin_config
from spec_decode import optimizers
from spec_decode import train_checkpoints
from spec_decode import train_loop
from spec_decode import training
from spec_decode.models import t5
from spec_decode.models.config import T5Config

# A student and a larger teacher over a 32-token vocabulary.
STUDENT = fake_models.tiny_t5(32)
TEACHER = dataclasses.replace(STUDENT, emb_dim=24, num_decoder_layers=2)
# A student with no encoder, reading the teacher's (width 24).
SHARED_STUDENT = dataclasses.replace(
    STUDENT, num_encoder_layers=0, shared_encoder_dim=24
)


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _batch(rng, rows=4, length=6):
  targets = rng.integers(3, 32, size=(rows, length)).astype(np.int32)
  return {
      "encoder_input_tokens": rng.integers(3, 32, (rows, 7)).astype(np.int32),
      "decoder_target_tokens": targets,
      "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
      "decoder_loss_weights": np.ones((rows, length), np.int32),
  }


def _step(student, teacher, distill, optimizer, z_loss=0.0):
  return jax.jit(
      functools.partial(
          training.train_step,
          model=t5.Transformer(student),
          optimizer=optimizer,
          dropout_seed=0,
          z_loss=z_loss,
          teacher=t5.Transformer(teacher),
          distill=distill,
      )
  )


class DivergenceTest(parameterized.TestCase):

  @parameterized.parameters(1.0, 0.5)
  def test_matches_numpy(self, temperature):
    rng = np.random.default_rng(0)
    student = rng.normal(size=(2, 3, 5)).astype(np.float32)
    teacher = 2 * rng.normal(size=(2, 3, 5)).astype(np.float32)
    weights = np.array([[1, 1, 0], [1, 0, 0]], np.int32)
    p = _softmax(teacher / temperature)
    q = _softmax(student / temperature)
    kl = (p * np.log(p / q)).sum(-1)
    # Total variation is 1 - beta, beta = sum min(p, q) (Corollary 3.6).
    tv = 1 - np.minimum(p, q).sum(-1)
    np.testing.assert_allclose(
        0.5 * np.abs(p - q).sum(-1), tv, rtol=1e-6, atol=1e-7
    )
    for kind, expected in (("forward_kl", kl), ("tvd", tv)):
      np.testing.assert_allclose(
          distillation.divergence(student, teacher, weights, kind, temperature),
          (expected * weights).sum(),
          rtol=1e-5,
          err_msg=kind,
      )

  def test_zero_for_the_same_distribution(self):
    logits = np.random.default_rng(1).normal(size=(2, 4, 7))
    weights = np.ones((2, 4))
    for kind in distillation.DIVERGENCES:
      self.assertAlmostEqual(
          float(distillation.divergence(logits, logits, weights, kind)),
          0.0,
          places=6,
      )

  def test_bad_settings_name_the_field(self):
    with self.assertRaisesRegex(ValueError, "divergence 'js' is not one of"):
      distillation.Distillation(divergence="js")
    with self.assertRaisesRegex(ValueError, "temperature must be > 0"):
      distillation.Distillation(temperature=0.0)


class DistillStepTest(absltest.TestCase):

  def test_teacher_as_student_has_no_gradient(self):
    # Forward KL is 0 at q = p, and so is its gradient; with no z-loss and
    # no cross-entropy the update is zero.
    rng = np.random.default_rng(0)
    optimizer = optimizers.adamw(1e-3)
    state = training.init_state(STUDENT, optimizer, jax.random.key(0))
    step = _step(STUDENT, STUDENT, distillation.Distillation(), optimizer)
    _, metrics = step(state, _batch(rng), state.params)
    self.assertLess(float(metrics["divergence"]), 1e-6)
    self.assertLess(float(metrics["grad_norm"]), 1e-6)

  def test_cross_entropy_weight_adds_the_plain_loss(self):
    rng = np.random.default_rng(0)
    batch = _batch(rng)
    optimizer = optimizers.adamw(1e-3)
    state = training.init_state(STUDENT, optimizer, jax.random.key(0))
    teacher_params = t5.init_params(TEACHER, jax.random.key(1))
    plain = jax.jit(
        functools.partial(
            training.train_step,
            model=t5.Transformer(STUDENT),
            optimizer=optimizer,
            dropout_seed=0,
            z_loss=1e-4,
        )
    )
    _, plain_metrics = plain(state, batch)
    distill = distillation.Distillation(cross_entropy_weight=0.5)
    _, metrics = _step(STUDENT, TEACHER, distill, optimizer, z_loss=1e-4)(
        state, batch, teacher_params
    )
    ce = float(plain_metrics["loss"]) - float(plain_metrics["z_loss"])
    np.testing.assert_allclose(
        float(metrics["loss"]),
        0.5 * ce
        + float(plain_metrics["z_loss"])
        + float(metrics["divergence"]),
        rtol=1e-5,
    )

  def test_student_learns_the_teachers_distribution(self):
    rng = np.random.default_rng(0)
    batch = _batch(rng)
    optimizer = optimizers.adamw(3e-3)
    state = training.init_state(STUDENT, optimizer, jax.random.key(0))
    teacher_params = t5.init_params(TEACHER, jax.random.key(1))
    for kind in distillation.DIVERGENCES:
      step = _step(
          STUDENT,
          TEACHER,
          distillation.Distillation(divergence=kind),
          optimizer,
      )
      current, divergences = state, []
      for _ in range(60):
        current, metrics = step(current, batch, teacher_params)
        divergences.append(float(metrics["divergence"]))
      self.assertLess(divergences[-1], 0.3 * divergences[0], msg=kind)


class SharedEncoderStudentTest(absltest.TestCase):

  def test_learns_through_the_frozen_teacher_encoding(self):
    rng = np.random.default_rng(0)
    batch = _batch(rng)
    optimizer = optimizers.adamw(3e-3)
    state = training.init_state(SHARED_STUDENT, optimizer, jax.random.key(0))
    teacher_params = t5.init_params(TEACHER, jax.random.key(1))
    step = _step(
        SHARED_STUDENT, TEACHER, distillation.Distillation(), optimizer
    )
    current, divergences = state, []
    for _ in range(60):
      current, metrics = step(current, batch, teacher_params)
      divergences.append(float(metrics["divergence"]))
    self.assertLess(divergences[-1], 0.3 * divergences[0])
    self.assertNotIn("encoder", current.params)
    moved = current.params["encoder_projection"]["kernel"]
    self.assertGreater(
        float(
            np.abs(moved - state.params["encoder_projection"]["kernel"]).max()
        ),
        1e-3,
    )
    # Evaluation reads the same encoding: its divergence is the train step's
    # on the same batch, without dropout (the student has none here).
    eval_metrics = jax.jit(
        functools.partial(
            training.eval_step,
            model=t5.Transformer(SHARED_STUDENT),
            teacher=t5.Transformer(TEACHER),
        )
    )(current.params, batch, teacher_params)
    _, after = step(current, batch, teacher_params)
    np.testing.assert_allclose(
        float(eval_metrics["forward_kl"]) / float(eval_metrics["tokens"]),
        float(after["divergence"]),
        rtol=1e-5,
    )


class DistillLoopTest(absltest.TestCase):

  def tearDown(self):
    gin.clear_config()
    super().tearDown()

  def test_train_loads_the_teacher_and_reports_its_divergences(self):
    directory = tempfile.TemporaryDirectory()
    self.addCleanup(directory.cleanup)
    teacher = dataclasses.replace(TEACHER, vocab_size=4096)
    teacher_dir = os.path.join(directory.name, "teacher")
    train_checkpoints.export_params(
        t5.init_params(teacher, jax.random.key(1)), teacher_dir
    )
    fields = ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim")
    fields += ("num_encoder_layers", "num_decoder_layers")
    gin_config.parse(
        [],
        [f"teacher/T5Config.{f} = {getattr(teacher, f)}" for f in fields]
        + [f"teacher/checkpoint_path.path = '{teacher_dir}'"],
    )
    test_files = data.DEMO_DIR / "multi30k"
    model_dir = os.path.join(directory.name, "student")
    train_loop.train(
        dataclasses.replace(STUDENT, vocab_size=4096),
        model_dir=model_dir,
        task=data.distillation_task(
            target_file=test_files / "test_2016_flickr.de.gz",
            source_file=test_files / "test_2016_flickr.en.gz",
            name="distillation_test_task",
        ),
        num_steps=2,
        batch_size=8,
        feature_lengths={"inputs": 32, "targets": 32},
        optimizer=optimizers.adamw(1e-3),
        eval_task=data.MULTI30K,
        eval_split="test",
        eval_every=2,
        log_every=1,
        distill=distillation.Distillation(divergence="tvd"),
    )
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
      metrics = [json.loads(line) for line in f]
    self.assertEqual([m["step"] for m in metrics], [1, 2, 2])
    self.assertBetween(metrics[0]["divergence"], 0.0, 1.0)
    # Two random models over 4,096 tokens disagree almost everywhere.
    self.assertBetween(metrics[-1]["eval_tvd"], 0.5, 1.0)
    self.assertGreater(metrics[-1]["eval_forward_kl"], 0.0)

  def test_config_parses(self):
    gin_config.parse(["train/multi30k_draft_distillspec.gin"])
    self.assertEqual(T5Config().num_decoder_layers, 1)
    with gin.config_scope("teacher"):
      self.assertEqual(T5Config().num_decoder_layers, 6)
    self.assertEqual(distillation.Distillation().divergence, "forward_kl")

  def test_shared_encoder_config_parses(self):
    gin_config.parse(["train/multi30k_draft_shared.gin"])
    self.assertEqual(T5Config().shared_encoder_dim, 512)
    self.assertEqual(T5Config().num_encoder_layers, 0)
    with gin.config_scope("teacher"):
      self.assertEqual(T5Config().shared_encoder_dim, 0)
      self.assertEqual(T5Config().emb_dim, 512)

  def test_two_layer_shared_greedy_config_parses(self):
    gin_config.parse(
        ["train/multi30k_draft_shared2_greedy.gin"],
        ["TARGET_OUTPUTS = 'outputs.de'"],
    )
    self.assertEqual(T5Config().shared_encoder_dim, 512)
    self.assertEqual(T5Config().num_decoder_layers, 2)
    with gin.config_scope("source"):  # What it grows from.
      self.assertEqual(T5Config().num_decoder_layers, 1)
    with gin.config_scope("teacher"):
      self.assertEqual(T5Config().num_decoder_layers, 6)
    self.assertEqual(distillation.Distillation().cross_entropy_weight, 0.5)
    self.assertEqual(
        gin.query_parameter("train.init_from"),
        "spec_decode/demo/draft_shared_greedy_48m",
    )

  def test_two_layer_shared_sampled_config_parses(self):
    gin_config.parse(
        ["train/multi30k_draft_shared2_sampled.gin"],
        ["TARGET_OUTPUTS = 'samples.de'"],
    )
    for scope in ("", "source"):  # Fine-tuned at its own size.
      with gin.config_scope(scope):
        self.assertEqual(T5Config().shared_encoder_dim, 512)
        self.assertEqual(T5Config().num_decoder_layers, 2)
    with gin.config_scope("teacher"):
      self.assertEqual(T5Config().num_decoder_layers, 6)
    self.assertEqual(distillation.Distillation().cross_entropy_weight, 0.0)
    self.assertEqual(distillation.Distillation().temperature, 1.0)
    self.assertEqual(
        gin.query_parameter("train.init_from"),
        "spec_decode/demo/draft_shared2_greedy_48m",
    )


if __name__ == "__main__":
  absltest.main()
