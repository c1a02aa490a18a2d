"""Tests for teacher_forced.py: alpha from teacher-forced scores."""

import os
import pathlib

from absl.testing import absltest
from absl.testing import parameterized
import gin
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import compare
from spec_decode import data  # pylint: disable=unused-import
from spec_decode import engine
from spec_decode import gin_config
from spec_decode import inputs as inputs_lib
from spec_decode import lookup
from spec_decode import pair
from spec_decode import partitioning
from spec_decode import sampling
from spec_decode import speculative
from spec_decode import teacher_forced
from spec_decode import vocabulary

_REPO = pathlib.Path(__file__).resolve().parent.parent
GREEDY = sampling.SamplingConfig(temperature=0.0)
SAMPLED = sampling.SamplingConfig(temperature=1.0)


class FormulaTest(absltest.TestCase):

  def test_betas_are_the_overlap_of_the_two_distributions(self):
    target = jnp.log(jnp.array([[[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]]))
    draft = jnp.log(jnp.array([[[0.2, 0.3, 0.5], [0.6, 0.3, 0.1]]]))
    np.testing.assert_allclose(
        teacher_forced.position_betas(target, draft, SAMPLED),
        [[0.2 + 0.3 + 0.2, 0.1 + 0.1 + 0.1]],
        rtol=1e-6,
    )
    # Greedy: one-hots, so beta says whether the argmaxes agree.
    np.testing.assert_array_equal(
        teacher_forced.position_betas(target, draft, GREEDY), [[0.0, 0.0]]
    )
    np.testing.assert_array_equal(
        teacher_forced.position_betas(target, target, GREEDY), [[1.0, 1.0]]
    )

  def test_estimate_is_the_ratio_over_positions(self):
    betas = np.array([[1.0, 0.0, 9.0], [0.5, 0.5, 0.5]])
    lengths = np.array([2, 3])
    result = teacher_forced.estimate(betas, lengths, 1.0)
    self.assertAlmostEqual(result.alpha, 2.5 / 5)
    self.assertEqual((result.positions, result.sentences), (5, 2))
    # Sentence sums 1 and 1.5 against alpha * n = 1 and 1.5: no spread.
    self.assertAlmostEqual(result.standard_error, 0.0)
    spread = teacher_forced.estimate(
        np.array([[1.0, 1.0], [0.0, 0.0]]), [2, 2], 1.0
    )
    # Residuals +1, -1: sqrt(2 / (2 * 1)) / 2.
    self.assertAlmostEqual(spread.standard_error, 0.5)

  def test_tokens_per_call_follow_eq_1(self):
    result = teacher_forced.AlphaEstimate(0.0, 0.5, 0.0, 10, 1)
    self.assertAlmostEqual(result.tokens_per_call()[1], 1.5)
    self.assertAlmostEqual(result.tokens_per_call()[8], (1 - 0.5**9) / 0.5)


class DemoPairTest(parameterized.TestCase):
  """On the demo pair: the loop's own alpha, without the loop."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    os.chdir(_REPO)
    gin_config.parse(
        [_REPO / "configs" / "demo.gin"],
        ["read_inputs.num_examples = 64", "run.max_decode_len = 48"],
    )
    vocab = vocabulary.bound_for_run()
    cls.max_decode_len = gin.query_parameter("run.max_decode_len")
    cls.tokens = inputs_lib.encode(
        inputs_lib.read_inputs(), vocab, 64, True
    ).tokens
    mesh = partitioning.make_mesh()
    target = pair.load_model("target", mesh)
    draft = pair.load_model("draft", mesh)
    cls.target_only = engine.Engine(mesh, target.model, target.params)
    cls.both = engine.Engine(
        mesh, target.model, target.params, draft.model, draft.params
    )
    # A bigram draft counted over the test references: a draft with no
    # model, whose q reads only the token before.
    bigram = engine.place_ngram(
        compare.ngram_params(
            "bigram",
            str(_REPO / "spec_decode/demo/multi30k/test_2016_flickr.de.gz"),
            vocab,
            target.config.vocab_size,
        ),
        mesh,
    )
    prompt_lookup = lookup.PromptLookup(target.config.vocab_size)
    cls.loops = {
        "t5": cls.both,
        "bigram": engine.Engine(
            mesh, target.model, target.params, None, bigram
        ),
        "lookup": engine.Engine(
            mesh, target.model, target.params, None, prompt_lookup
        ),
    }
    cls.scorer = teacher_forced.Scorer(
        target.model,
        target.params,
        {
            "t5": (draft.model, draft.params),
            "bigram": (None, bigram),
            "lookup": (None, prompt_lookup),
        },
        mesh,
    )

  @classmethod
  def tearDownClass(cls):
    gin.clear_config()
    super().tearDownClass()

  def _loop(self, config, num_rows, seed, decoders=None):
    """The speculative loop's results on the first `num_rows` inputs."""
    decoders = decoders or self.both
    results = []
    for index, (batch, num_real) in enumerate(
        inputs_lib.batches(self.tokens[:num_rows], 8)
    ):
      result = decoders.speculative(
          decoders.place_inputs(batch),
          jax.random.fold_in(jax.random.key(seed), index),
          gamma=4,
          max_decode_len=self.max_decode_len,
          config=config,
      )
      results.append(jax.tree.map(lambda x: np.asarray(x)[:num_real], result))
    return jax.tree.map(lambda *x: np.concatenate(x), *results)

  @parameterized.parameters("t5", "bigram", "lookup")
  def test_greedy_betas_at_the_judged_positions_are_the_loops(self, draft):
    # Greedy, the loop judges each drafted token in the context of the
    # target's greedy outputs so far: the teacher-forced context. At the
    # positions it judged (all but its bonus tokens), the betas here must be
    # its betas exactly: 0 or 1, summing to its accepted tokens.
    outputs, betas, lengths = teacher_forced.betas_of(
        self.target_only,
        self.scorer,
        self.tokens[:24],
        GREEDY,
        8,
        self.max_decode_len,
    )
    betas = betas[draft]
    loop = self._loop(GREEDY, 24, 0, self.loops[draft])
    np.testing.assert_array_equal(loop.sequences, outputs)
    np.testing.assert_array_equal(loop.lengths, lengths)
    judged = (loop.token_sources == speculative.ACCEPTED) | (
        loop.token_sources == speculative.REPLACEMENT
    )
    np.testing.assert_array_equal(np.sum(judged, 1), loop.drafted_tokens)
    np.testing.assert_array_equal(
        np.sum(betas * judged, 1), loop.accepted_tokens
    )
    np.testing.assert_array_equal(np.sum(betas * judged, 1), loop.beta_sum)
    self.assertBetween(np.sum(betas * judged) / np.sum(judged), 0.02, 0.95)

  def test_sampled_alpha_agrees_with_the_loops(self):
    # Temperature 1: different samples, the same expectation. The loop's
    # alpha (mean beta over its judged positions) and this one (over all
    # positions of independent samples) must agree within 3.5 standard
    # errors of their difference (each over sentences): a false alarm in
    # about 1 run of 2,000 if both are unbiased. Skipping the loop's bonus
    # positions biases it by far less than that error.
    _, betas, lengths = teacher_forced.betas_of(
        self.target_only,
        self.scorer,
        self.tokens,
        SAMPLED,
        16,
        self.max_decode_len,
        seed=1,
    )
    mine = teacher_forced.estimate(betas["t5"], lengths, 1.0)
    loop = self._loop(SAMPLED, len(self.tokens), 2)
    theirs = teacher_forced.from_sums(loop.beta_sum, loop.drafted_tokens, 1.0)
    error = np.hypot(mine.standard_error, theirs.standard_error)
    self.assertLess(error, 0.03)
    self.assertLess(abs(mine.alpha - theirs.alpha), 3.5 * error)


if __name__ == "__main__":
  absltest.main()
