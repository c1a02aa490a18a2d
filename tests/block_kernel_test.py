"""Tests for spec_decode.verify: the block kernel, against the closed form.

Small models (V = 2 or 3, gamma <= 3) have few enough drafted blocks to
enumerate: for each block X the kernels give the law of the number tau of
drafts kept (block: P(tau = i | X) = h_i prod_{j > i} (1 - h_j); token-wise:
the product of the acceptance probabilities up to i, times a rejection),
and the next token's residual. Summing over X and completing each emitted
prefix with the target gives the exact law of the first gamma + 1 tokens,
which must be the target's, to float32 rounding (`BlockKernelTest`, for both
kernels; the block kernel also keeps at least the token kernel's drafts).

The token-wise kernel's own tests, by sampling, are in token_kernel_test.py.
"""

import itertools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from spec_decode import verify

# The paper's motivating example (Sun et al., section 2): V = 2, the same
# p and q at every position.
P_MOTIVATING = np.array([1 / 3, 2 / 3], np.float32)
Q_MOTIVATING = np.array([2 / 3, 1 / 3], np.float32)


def _tables(seed, vocab_size, gamma, concentration=0.7):
  """Random p and q for every prefix of up to gamma tokens."""
  rng = np.random.default_rng(seed)
  prefixes = [
      prefix
      for length in range(gamma + 1)
      for prefix in itertools.product(range(vocab_size), repeat=length)
  ]
  draw = lambda: rng.dirichlet(np.full(vocab_size, concentration))
  return {x: draw() for x in prefixes}, {x: draw() for x in prefixes}


def _constant_tables(p, q, gamma):
  prefixes = [
      prefix
      for length in range(gamma + 1)
      for prefix in itertools.product(range(len(p)), repeat=length)
  ]
  return {x: p for x in prefixes}, {x: q for x in prefixes}


def _blocks(target, draft, vocab_size, gamma):
  """Every drafted block, its draft probability and the kernels' inputs."""
  blocks = list(itertools.product(range(vocab_size), repeat=gamma))
  target_probs = np.array(
      [[target[x[:i]] for i in range(gamma + 1)] for x in blocks], np.float32
  )  # [N, gamma + 1, V]
  draft_probs = np.array(
      [[draft[x[:i]] for i in range(gamma)] for x in blocks], np.float32
  )  # [N, gamma, V]
  probability = np.array(
      [np.prod([draft[x[:i]][x[i]] for i in range(gamma)]) for x in blocks]
  )
  return blocks, probability, target_probs, draft_probs


def _tau_laws(verifier, target_probs, draft_probs, tokens, num_drafted):
  """P(tau = i | X): float64 [N, gamma + 1]; the residual weights w_tau."""
  tokens = jnp.asarray(tokens)
  gamma = tokens.shape[1]
  if verifier == "block":
    weights, stop = jax.tree.map(
        lambda x: np.asarray(x, np.float64),
        verify.block_weights(
            target_probs, draft_probs, tokens, jnp.asarray(num_drafted)
        ),
    )
    laws = np.zeros((len(tokens), gamma + 1))
    rest = np.ones(len(tokens))
    for i in range(gamma, 0, -1):
      laws[:, i] = rest * stop[:, i - 1]
      rest = rest * (1 - stop[:, i - 1])
    laws[:, 0] = rest
    return laws, weights
  target_token = np.take_along_axis(
      np.asarray(target_probs, np.float64)[:, :-1], tokens[..., None], -1
  )[..., 0]
  draft_token = np.take_along_axis(
      np.asarray(draft_probs, np.float64), tokens[..., None], -1
  )[..., 0]
  accept = np.minimum(
      1.0, target_token / np.where(draft_token > 0, draft_token, 1.0)
  )  # [N, gamma]; where q(x) = 0, X is never drafted
  accept[np.arange(gamma)[None, :] >= num_drafted[:, None]] = 0.0
  reach = np.cumprod(np.pad(accept, ((0, 0), (1, 0)), constant_values=1), 1)
  laws = reach * np.pad(1 - accept, ((0, 0), (0, 1)), constant_values=1)
  return laws, np.ones((len(tokens), gamma + 1))


def _law_of_first_tokens(verifier, target, draft, vocab_size, gamma, stop_at):
  """The exact law of the first gamma + 1 tokens emitted, and the target's.

  Args:
    verifier: 'token' or 'block'.
    target, draft: prefix -> distribution tables.
    vocab_size: V.
    gamma: drafts per block.
    stop_at: block -> drafts proposed (a function of the block's prefix).

  Returns:
    Two dicts: (gamma + 1)-token string -> probability, emitted and target.
  """
  blocks, probability, target_probs, draft_probs = _blocks(
      target, draft, vocab_size, gamma
  )
  num_drafted = np.array([stop_at(x) for x in blocks], np.int32)
  laws, weights = _tau_laws(
      verifier, target_probs, draft_probs, blocks, num_drafted
  )
  emitted = {}
  for x, law, weight, k in zip(blocks, laws, weights, num_drafted):
    # Tokens past k were never proposed: only the prefix's probability.
    prob = np.prod([draft[x[:i]][x[i]] for i in range(k)])
    if prob == 0:
      continue
    for tau in range(k + 1):
      if law[tau] == 0:  # Its residual may be all zero.
        continue
      next_draft = draft[x[:tau]] if tau < k else np.zeros(vocab_size)
      residual = np.asarray(
          verify.residual_probs(
              jnp.float32(weight[tau]) * target[x[:tau]].astype(np.float32),
              next_draft.astype(np.float32),
          ),
          np.float64,
      )
      residual /= residual.sum()
      for y in range(vocab_size):
        head = x[:tau] + (y,)
        for tail in itertools.product(range(vocab_size), repeat=gamma - tau):
          s = head + tail
          extension = np.prod(
              [target[s[:j]][s[j]] for j in range(tau + 1, gamma + 1)]
          )
          # Blocks sharing the proposed prefix appear V^(gamma - k) times.
          share = vocab_size ** (gamma - k)
          emitted[s] = emitted.get(s, 0.0) + (
              prob * law[tau] * residual[y] * extension / share
          )
  exact = {
      s: np.prod([target[s[:j]][s[j]] for j in range(gamma + 1)])
      for s in itertools.product(range(vocab_size), repeat=gamma + 1)
  }
  return emitted, exact


def _expected_accepted(verifier, target, draft, vocab_size, gamma):
  blocks, probability, target_probs, draft_probs = _blocks(
      target, draft, vocab_size, gamma
  )
  laws, _ = _tau_laws(
      verifier,
      target_probs,
      draft_probs,
      blocks,
      np.full(len(blocks), gamma, np.int32),
  )
  return float(np.sum(probability * (laws @ np.arange(gamma + 1))))


class BlockKernelTest(parameterized.TestCase):

  def test_worked_example_of_the_docstring(self):
    p = jnp.broadcast_to(P_MOTIVATING, (2, 3, 2))
    q = jnp.broadcast_to(Q_MOTIVATING, (2, 2, 2))
    tokens = jnp.array([[0, 1], [1, 0]])
    weights, stop = verify.block_weights(p, q, tokens)
    np.testing.assert_allclose(weights, [[1, 0.5, 1], [1, 1, 0.5]], atol=1e-7)
    np.testing.assert_allclose(stop, [[0, 1], [1, 0.5]], atol=1e-7)
    # Any coins keep both drafts of [0, 1]; [1, 0] keeps x_2 when eta_2 < 1/2.
    coins = jnp.array([[0.99, 0.99], [0.99, 0.7]])
    np.testing.assert_array_equal(
        verify.block_accepted_count(coins, stop), [2, 1]
    )
    np.testing.assert_array_equal(
        verify.block_accepted_count(jnp.array([[0.5, 0.3]] * 2), stop), [2, 2]
    )
    residual = verify.residual_probs(weights[1, 1] * p[1, 1], q[1, 1])
    np.testing.assert_allclose(residual, [0, 1 / 3], atol=1e-7)

  def test_motivating_example_keeps_11_9_drafts_where_token_keeps_10_9(self):
    target, draft = _constant_tables(P_MOTIVATING, Q_MOTIVATING, 2)
    block = _expected_accepted("block", target, draft, 2, 2)
    token = _expected_accepted("token", target, draft, 2, 2)
    self.assertAlmostEqual(block, 11 / 9, places=6)
    self.assertAlmostEqual(token, 10 / 9, places=6)

  @parameterized.parameters(0, 1, 2, 3, 4, 5)
  def test_block_keeps_at_least_as_many_drafts_as_token(self, seed):
    target, draft = _tables(seed, 3, 3)
    block = _expected_accepted("block", target, draft, 3, 3)
    token = _expected_accepted("token", target, draft, 3, 3)
    self.assertGreaterEqual(block, token - 1e-6)
    # Random p and q leave room for a strict gain.
    self.assertGreater(block, token + 1e-3)

  def test_identical_draft_keeps_every_draft_under_both(self):
    target, _ = _tables(0, 3, 3)
    for verifier in verify.VERIFIERS:
      self.assertAlmostEqual(
          _expected_accepted(verifier, target, target, 3, 3), 3.0, places=6
      )

  @parameterized.product(
      verifier=verify.VERIFIERS,
      case=["random", "random_sharp", "motivating", "disjoint_support"],
      early_stop=[False, True],
  )
  def test_law_of_the_emitted_tokens_is_the_targets(
      self, verifier, case, early_stop
  ):
    vocab_size, gamma = (2, 2) if case == "motivating" else (3, 3)
    if case == "motivating":
      target, draft = _constant_tables(P_MOTIVATING, Q_MOTIVATING, gamma)
    elif case == "disjoint_support":
      target, draft = _constant_tables(
          np.array([0.5, 0.5, 0.0]), np.array([0.0, 0.3, 0.7]), gamma
      )
    else:
      target, draft = _tables(
          7, vocab_size, gamma, 0.2 if case == "random_sharp" else 0.7
      )

    def stop_at(block):
      # Stop after the first draft the draft gave less than 0.45.
      if not early_stop:
        return gamma
      for i in range(gamma):
        if draft[block[:i]][block[i]] < 0.45:
          return i + 1
      return gamma

    emitted, exact = _law_of_first_tokens(
        verifier, target, draft, vocab_size, gamma, stop_at
    )
    self.assertAlmostEqual(sum(emitted.values()), 1.0, places=5)
    for s, prob in exact.items():
      self.assertAlmostEqual(emitted.get(s, 0.0), prob, places=6, msg=s)

  def test_sampled_tau_and_next_token_follow_the_closed_form(self):
    # verify_block with its own coins and residual draws, 200,000 rows of
    # the motivating example: the joint law of (tau, next token) has 6 cells.
    num_rows = 200_000
    drafts = jax.random.bernoulli(
        jax.random.key(0), float(Q_MOTIVATING[1]), (num_rows, 2)
    ).astype(jnp.int32)
    num_accepted, next_tokens, _ = verify.verify_block(
        jax.random.key(1),
        jax.random.key(2),
        jnp.broadcast_to(P_MOTIVATING, (num_rows, 3, 2)),
        jnp.broadcast_to(Q_MOTIVATING, (num_rows, 2, 2)),
        drafts,
    )
    observed = np.zeros((3, 2))
    np.add.at(observed, (np.asarray(num_accepted), np.asarray(next_tokens)), 1)
    target, draft = _constant_tables(P_MOTIVATING, Q_MOTIVATING, 2)
    blocks, probability, target_probs, draft_probs = _blocks(
        target, draft, 2, 2
    )
    laws, weights = _tau_laws(
        "block", target_probs, draft_probs, blocks, np.full(4, 2, np.int32)
    )
    expected = np.zeros((3, 2))
    for x, prob, law, weight in zip(blocks, probability, laws, weights):
      for tau in np.flatnonzero(law):
        next_draft = Q_MOTIVATING if tau < 2 else np.zeros(2)
        residual = np.maximum(weight[tau] * P_MOTIVATING - next_draft, 0)
        expected[tau] += prob * law[tau] * residual / residual.sum()
    self.assertAlmostEqual(expected.sum(), 1.0, places=6)
    expected = expected.ravel() / expected.sum()
    cells = expected > 0
    np.testing.assert_array_equal(observed.ravel()[~cells], 0)
    _, p_value = scipy.stats.chisquare(
        observed.ravel()[cells], num_rows * expected[cells]
    )
    self.assertGreater(p_value, 1e-4)

  def test_one_hot_distributions_give_the_greedy_count(self):
    # Target argmax [2, 0, 3, 1]; drafts agreeing for 0, 1, 2 and 3 tokens.
    target_tokens = jnp.array([2, 0, 3, 1])
    drafts = jnp.array([[1, 0, 3], [2, 1, 3], [2, 0, 0], [2, 0, 3]])
    target_logits = jnp.broadcast_to(
        10.0 * jax.nn.one_hot(target_tokens, 4), (4, 4, 4)
    )
    target_probs = jax.nn.one_hot(jnp.broadcast_to(target_tokens, (4, 4)), 4)
    draft_probs = jax.nn.one_hot(drafts, 4)
    _, stop = verify.block_weights(target_probs, draft_probs, drafts)
    coins = jax.random.uniform(jax.random.key(0), (4, 3))
    greedy = verify.verify_greedy(target_logits, drafts)[0]
    np.testing.assert_array_equal(greedy, [0, 1, 2, 3])
    np.testing.assert_array_equal(
        verify.block_accepted_count(coins, stop), greedy
    )

  def test_num_drafted_cuts_the_block(self):
    # The target as its own draft: every proposed draft is kept, then the
    # bonus token comes from p_{k+1}, a one-hot on 3 (k = num_drafted).
    uniform = jnp.full((3, 1, 4), 0.25)
    one_hot = jnp.broadcast_to(jnp.eye(4)[3], (3, 3, 4))
    target_probs = jnp.concatenate([uniform, one_hot], axis=1)  # [3, 4, 4]
    tokens = jnp.array([[0, 3, 3]] * 3)
    num_drafted = jnp.array([1, 2, 3])
    for kernel in (verify.verify, verify.verify_block):
      num_accepted, next_tokens, _ = kernel(
          jax.random.key(0),
          jax.random.key(1),
          target_probs,
          target_probs[:, :-1],
          tokens,
          num_drafted,
      )
      np.testing.assert_array_equal(num_accepted, num_drafted)
      np.testing.assert_array_equal(next_tokens, 3)


if __name__ == "__main__":
  absltest.main()
