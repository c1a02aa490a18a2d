"""Tests for spec_decode.analysis against hand-computed values."""

from absl.testing import absltest
from absl.testing import parameterized

from spec_decode import analysis


class ExpectedTokensTest(parameterized.TestCase):

  @parameterized.parameters(
      (0.5, 1, 1.5),  # (1 - 1/4) / (1/2)
      (0.5, 3, 1.875),  # (1 - 1/16) / (1/2)
      (0.0, 5, 1.0),  # Every draft rejected: one token per call.
      (1.0, 7, 8.0),  # Every draft accepted: gamma + 1.
      (0.75, 7, 3.59954833984375),  # 4 (1 - 0.75^8); the paper's En-De row.
      (0.3, 0, 1.0),  # No drafting at all.
  )
  def test_hand_values(self, alpha, gamma, expected):
    self.assertAlmostEqual(
        analysis.expected_tokens_per_call(alpha, gamma), expected, places=12
    )

  def test_continuous_at_alpha_one(self):
    self.assertAlmostEqual(
        analysis.expected_tokens_per_call(1 - 1e-12, 7), 8.0, places=9
    )


class WalltimeTest(parameterized.TestCase):

  @parameterized.parameters(
      (0.5, 1, 0.5, 1.0),  # 1.5 / 1.5
      (0.9, 4, 0.1, (1 - 0.9**5) / 0.1 / 1.4),
      (1.0, 3, 0.25, 4 / 1.75),
  )
  def test_hand_values(self, alpha, gamma, c, expected):
    self.assertAlmostEqual(
        analysis.walltime_improvement(alpha, gamma, c), expected, places=12
    )

  @parameterized.parameters((0.6, 0.1), (0.2, 0.5), (0.9, 0.0))
  def test_gamma_one_gives_corollary_3_9(self, alpha, c):
    self.assertAlmostEqual(
        analysis.walltime_improvement(alpha, 1, c), (1 + alpha) / (1 + c)
    )

  @parameterized.parameters(
      (0.9, 0.1, 10),  # 3.4280 at 9, 3.4309 at 10, 3.4170 at 11.
      (0.75, 0.02, 9),  # 3.1894 at 8, 3.1989 at 9, 3.1925 at 10.
      (0.5, 0.5, 1),  # 1.0 at 1, 0.875 at 2.
      (0.0, 0.0, 1),  # All gammas tie at 1: the smallest wins.
  )
  def test_optimal_gamma(self, alpha, c, expected):
    self.assertEqual(analysis.optimal_gamma(alpha, c), expected)

  def test_optimal_gamma_is_capped_when_alpha_is_one(self):
    self.assertEqual(analysis.optimal_gamma(1.0, 0.01, max_gamma=20), 20)


class CallCostSpeedupTest(parameterized.TestCase):

  @parameterized.parameters((0.0, 1, 0.0), (0.6, 4, 0.1), (0.9, 7, 0.02))
  def test_a_verify_call_costing_one_step_gives_theorem_3_8(
      self, alpha, gamma, c
  ):
    tokens = analysis.expected_tokens_per_call(alpha, gamma)
    self.assertAlmostEqual(
        analysis.call_cost_speedup(tokens, gamma, 2.0, 2.0, 2.0 * c),
        analysis.walltime_improvement(alpha, gamma, c),
        places=12,
    )

  def test_hand_value(self):
    # 2.5 tokens a call; 4 draft steps of 0.1 and a 5-token call of 2.1
    # against 1-token steps of 1.0.
    self.assertAlmostEqual(
        analysis.call_cost_speedup(2.5, 4, 1.0, 2.1, 0.1), 1.0, places=12
    )


class OperationsTest(parameterized.TestCase):

  @parameterized.parameters(
      (0.5, 1, 0.1, 2.1 / 1.5),
      (1.0, 4, 0.05, 5.2 / 5),  # Only the draft's operations are added.
      (0.0, 3, 0.1, 4.3),  # gamma c_hat + gamma + 1 per token.
  )
  def test_hand_values(self, alpha, gamma, c_hat, expected):
    self.assertAlmostEqual(
        analysis.operations_factor(alpha, gamma, c_hat), expected, places=12
    )


class InvalidArgumentsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("alpha", lambda: analysis.expected_tokens_per_call(1.5, 2), "alpha"),
      ("gamma", lambda: analysis.expected_tokens_per_call(0.5, -1), "gamma"),
      ("c", lambda: analysis.walltime_improvement(0.5, 2, -0.1), "c"),
      ("c_hat", lambda: analysis.operations_factor(0.5, 2, -1.0), "c_hat"),
      ("max_gamma", lambda: analysis.optimal_gamma(0.5, 0.1, 0), "max_gamma"),
      (
          "max_gamma_bool",
          lambda: analysis.optimal_gamma(0.5, 0.1, True),
          "max_gamma",
      ),
      (
          "gamma_bool",
          lambda: analysis.expected_tokens_per_call(0.5, True),
          "gamma",
      ),
      (
          "tokens_per_call",
          lambda: analysis.call_cost_speedup(0.0, 2, 1.0, 1.0, 0.1),
          "tokens_per_call",
      ),
      (
          "target_verify",
          lambda: analysis.call_cost_speedup(2.0, 2, 1.0, 0.0, 0.1),
          "target_verify",
      ),
      (
          "draft_step",
          lambda: analysis.call_cost_speedup(2.0, 2, 1.0, 1.0, -0.1),
          "draft_step",
      ),
  )
  def test_raises(self, call, name):
    with self.assertRaisesRegex(ValueError, f"^{name} must be"):
      call()


if __name__ == "__main__":
  absltest.main()
