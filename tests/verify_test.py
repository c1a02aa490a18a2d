"""Tests for spec_decode.verify: both verifiers' kernels in closed form.

Small models (V = 2 or 3, gamma <= 3) have few enough drafted blocks to
enumerate: for each block X the kernels give the law of the number tau of
drafts kept (block: P(tau = i | X) = h_i prod_{j > i} (1 - h_j); token-wise:
the product of the acceptance probabilities up to i, times a rejection),
and the next token's residual. Summing over X and completing each emitted
prefix with the target gives the exact law of the first gamma + 1 tokens,
which must be the target's, to float32 rounding.

The token-wise kernel also by sampling: its emitted token (`TokenKernelTest`),
and the whole block one call emits, bonus token included (`BlockLawTest`).
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

# The paper's motivating example (Sun et al., section 2): V = 2, the same
# p and q at every position.
P_MOTIVATING = np.array([1 / 3, 2 / 3], np.float32)
Q_MOTIVATING = np.array([2 / 3, 1 / 3], np.float32)
# The chi-square tests' level (a false alarm in 1 run of 10,000 per test).
CHI_SQUARE_LEVEL = 1e-4


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
