"""Tests for spec_decode.verify: the token-wise kernel, by sampling.

Its worked example and edge cases, and its emitted token (`TokenKernelTest`),
and the whole block one call emits, bonus token included (`BlockLawTest`):
both against closed-form laws, by chi-square tests on many sampled rows.

The block kernel's tests, and the exact enumeration of both kernels' laws on
small models, are in block_kernel_test.py.
"""

import collections
import itertools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from spec_decode import sampling
from spec_decode import verify

# The chi-square tests' level (a false alarm in 1 run of 10,000 per test).
CHI_SQUARE_LEVEL = 1e-4


class TokenKernelTest(parameterized.TestCase):

  def test_worked_example_of_the_docstring(self):
    draft_probs = jnp.array([[[0.1, 0.2, 0.5, 0.2], [0.1, 0.4, 0.3, 0.2]]])
    target_probs = jnp.array([[[0.1, 0.1, 0.6, 0.2], [0.3, 0.1, 0.3, 0.3]]])
    draft_tokens = jnp.array([[2, 1]])
    take = lambda probs: jnp.take_along_axis(
        probs, draft_tokens[..., None], axis=-1
    )[..., 0]
    num_accepted = verify.accepted_count(
        jnp.array([[0.9, 0.5]]), take(target_probs), take(draft_probs)
    )
    np.testing.assert_array_equal(num_accepted, [1])
    residual = verify.residual_probs(target_probs[0, 1], draft_probs[0, 1])
    np.testing.assert_allclose(residual, [0.2, 0, 0, 0.1], atol=1e-7)
    np.testing.assert_allclose(
        residual / residual.sum(), [2 / 3, 0, 0, 1 / 3], rtol=1e-6
    )

  def test_draft_probability_zero_needs_no_special_case(self):
    # r * 0 < p accepts exactly when p > 0, and nothing divides by zero.
    num_accepted = verify.accepted_count(
        jnp.array([[0.0, 0.99], [0.5, 0.0]]),
        jnp.array([[0.2, 0.1], [0.0, 0.3]]),
        jnp.array([[0.0, 0.0], [0.0, 0.0]]),
    )
    np.testing.assert_array_equal(num_accepted, [2, 0])

  def test_residual_of_equal_distributions_falls_back_to_the_target(self):
    target_probs = jnp.array([[0.25, 0.5, 0.25, 0.0]])
    residual = verify.residual_probs(target_probs, target_probs)
    np.testing.assert_array_equal(residual, target_probs)
    tokens = sampling.sample(
        jax.random.key(0), jnp.broadcast_to(residual, (1000, 4))
    )
    self.assertEqual(np.bincount(tokens, minlength=4)[3], 0)

  @parameterized.named_parameters(
      ("generic", [0.1, 0.2, 0.3, 0.4, 0.0], [0.3, 0.3, 0.1, 0.1, 0.2]),
      ("draft_misses_tokens", [0.1, 0.2, 0.3, 0.4, 0.0], [0.5, 0.5, 0, 0, 0]),
      ("equal", [0.1, 0.2, 0.3, 0.4, 0.0], [0.1, 0.2, 0.3, 0.4, 0.0]),
      ("one_hot_target", [0, 0, 1, 0, 0], [0.2, 0.2, 0.2, 0.2, 0.2]),
      ("disjoint", [0.5, 0.5, 0, 0, 0], [0, 0, 0, 0.5, 0.5]),
  )
  def test_emitted_token_has_the_target_distribution(
      self, target_probs, draft_probs
  ):
    target_probs = np.array(target_probs, np.float32)
    draft_probs = np.array(draft_probs, np.float32)

    # Exactly: P(y) = q(y) min(1, p(y) / q(y)) + P(reject) residual(y)
    #               = min(p(y), q(y)) + (1 - sum_x min(p, q)) residual(y).
    overlap = np.minimum(target_probs, draft_probs)
    residual = np.asarray(verify.residual_probs(target_probs, draft_probs))
    emitted = overlap + (1 - overlap.sum()) * residual / residual.sum()
    np.testing.assert_allclose(emitted, target_probs, atol=1e-7)

    # By sampling, with gamma = 1: the first emitted token is x_1 when it is
    # accepted, the residual's token otherwise.
    num_rows = 100_000
    draft_tokens = sampling.sample(
        jax.random.key(1), jnp.broadcast_to(draft_probs, (num_rows, 5))
    )[
        :, None
    ]  # [B, 1]
    num_accepted, next_tokens, _ = verify.verify(
        jax.random.key(2),
        jax.random.key(3),
        jnp.broadcast_to(target_probs, (num_rows, 2, 5)),
        jnp.broadcast_to(draft_probs, (num_rows, 1, 5)),
        draft_tokens,
    )
    tokens = np.where(num_accepted == 1, draft_tokens[:, 0], next_tokens)
    counts = np.bincount(tokens, minlength=5)
    support = target_probs > 0
    np.testing.assert_array_equal(counts[~support], 0)
    if support.sum() > 1:
      expected = target_probs[support].astype(np.float64)
      _, p_value = scipy.stats.chisquare(
          counts[support], num_rows * expected / expected.sum()
      )
      self.assertGreater(p_value, 1e-3)


def _block_law(target_probs, draft_probs):
  """The exact law of the block one verify call emits, for fixed p and q.

  With drafts x_i ~ q_i drawn independently and p_i fixed per position, the
  block (t_1..t_k) is emitted with probability
    prod_{i<k} min(p_i, q_i)(t_i) * max(0, p_k - q_k)(t_k)   for k <= gamma,
    prod_{i<=gamma} min(p_i, q_i)(t_i) * p_{gamma+1}(t_k)    for k = gamma + 1,
  since a rejection at k has probability 1 - beta_k and the residual is
  max(0, p_k - q_k) / (1 - beta_k).

  Args:
    target_probs: float64 [gamma + 1, V].
    draft_probs: float64 [gamma, V].

  Returns:
    Maps each block (a token tuple) to its probability.
  """
  gamma, vocab_size = draft_probs.shape
  overlap = np.minimum(target_probs[:-1], draft_probs)  # [gamma, V]
  closing = np.concatenate(
      [target_probs[:-1] - overlap, target_probs[-1:]]
  )  # [gamma + 1, V]
  law = {}
  for k in range(1, gamma + 2):
    for block in itertools.product(range(vocab_size), repeat=k):
      prefix = np.prod([overlap[i, t] for i, t in enumerate(block[:-1])])
      law[block] = prefix * closing[k - 1, block[-1]]
  return law


class BlockLawTest(parameterized.TestCase):
  """The law of the whole emitted block, bonus token included.

  gamma 2 and 3, a different p and q at every position (q with a zero where
  p is not), 200,000 rows in one `verify` call; the block counts must fit the
  closed-form law of `_block_law` (chi-square at CHI_SQUARE_LEVEL), and that
  law must marginalize to independent draws from p_1, p_2, ...
  """

  NUM_ROWS = 200_000
  VOCAB = 4

  def _probs(self, gamma, seed):
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.ones(self.VOCAB), gamma + 1)  # [gamma + 1, V]
    draft = rng.dirichlet(np.ones(self.VOCAB), gamma)  # [gamma, V]
    draft[0, 3] = 0.0  # The draft misses a token the target wants.
    draft[0] /= draft[0].sum()
    return target.astype(np.float32), draft.astype(np.float32)

  @parameterized.parameters((2, 0), (3, 1))
  def test_closed_form_law_emits_independent_target_draws(self, gamma, seed):
    target, draft = self._probs(gamma, seed)
    law = _block_law(target.astype(np.float64), draft.astype(np.float64))
    self.assertAlmostEqual(sum(law.values()), 1.0, places=6)
    # The first tokens of a block, emitted or not yet: P(block starts with t)
    # summed over the longer blocks equals prod_i p_i(t_i).
    for block in itertools.product(range(self.VOCAB), repeat=2):
      starts = sum(v for b, v in law.items() if b[:2] == block)
      starts += law.get(block[:1], 0) * target[1, block[1]]  # Next call.
      self.assertAlmostEqual(
          starts, target[0, block[0]] * target[1, block[1]], places=6
      )

  @parameterized.parameters((2, 0), (3, 1))
  def test_emitted_blocks_follow_the_closed_form_law(self, gamma, seed):
    target, draft = self._probs(gamma, seed)
    draft_rng, coin_rng, residual_rng = jax.random.split(
        jax.random.key(seed), 3
    )
    draft_tokens = jax.vmap(
        lambda key, probs: sampling.sample(
            key, jnp.broadcast_to(probs, (self.NUM_ROWS, self.VOCAB))
        ),
        out_axes=1,
    )(
        jax.random.split(draft_rng, gamma), jnp.asarray(draft)
    )  # [N, gamma]
    num_accepted, next_tokens, _ = verify.verify(
        coin_rng,
        residual_rng,
        jnp.broadcast_to(target, (self.NUM_ROWS, gamma + 1, self.VOCAB)),
        jnp.broadcast_to(draft, (self.NUM_ROWS, gamma, self.VOCAB)),
        draft_tokens,
    )
    counts = collections.Counter(
        tuple(row[:n]) + (y,)
        for row, n, y in zip(
            np.asarray(draft_tokens).tolist(),
            np.asarray(num_accepted).tolist(),
            np.asarray(next_tokens).tolist(),
        )
    )
    law = _block_law(target.astype(np.float64), draft.astype(np.float64))
    impossible = [b for b in counts if law.get(b, 0.0) == 0.0]
    self.assertEqual(impossible, [])
    self.assertGreater(
        sum(c for b, c in counts.items() if len(b) == gamma + 1), 5000
    )
    blocks = sorted((b for b in law if law[b] > 0), key=law.get)
    observed = np.array([counts[b] for b in blocks], np.float64)
    expected = self.NUM_ROWS * np.array([law[b] for b in blocks])
    rare = np.cumsum(expected) < 5  # Pooled until each cell expects 5.
    observed = np.concatenate([[observed[rare].sum()], observed[~rare]])
    expected = np.concatenate([[expected[rare].sum()], expected[~rare]])
    if expected[0] == 0:
      observed, expected = observed[1:], expected[1:]
    _, p_value = scipy.stats.chisquare(
        observed, expected * (self.NUM_ROWS / expected.sum())
    )
    self.assertGreater(p_value, CHI_SQUARE_LEVEL)


if __name__ == "__main__":
  absltest.main()
