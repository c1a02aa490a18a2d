"""spec_decode.run_totals: the run's sums and the results made of them."""

from absl.testing import absltest

from spec_decode import call_costs
from spec_decode import run_totals
from spec_decode import sampling


def _totals():
  totals = run_totals.RunTotals(gamma=3)
  totals.baseline_tokens = totals.speculative_tokens = 160
  totals.target_calls = 60
  totals.drafted = 180
  totals.accepted = 140
  totals.beta = 139.0
  return totals


def _results(seconds):
  return run_totals.results(
      _totals(),
      seconds,
      call_costs.StepCosts(
          target_step=0.002, target_verify=0.0026, draft_step=0.00006
      ),
      gamma=3,
      config=sampling.SamplingConfig(temperature=0.0),
      num_examples=10,
      num_truncated=0,
  )


class SecondsTest(absltest.TestCase):

  def test_add_sums_every_field(self):
    seconds = run_totals.Seconds()
    # Binary fractions, so that the sums are exact.
    seconds.add(run_totals.Seconds(0.5, 0.25, 0.0625, 0.125, batches=1))
    seconds.add(run_totals.Seconds(0.25, 0.125, 0.03125, 0.0625, batches=1))
    self.assertEqual(
        seconds, run_totals.Seconds(0.75, 0.375, 0.09375, 0.1875, batches=2)
    )


class ResultsTest(absltest.TestCase):

  def test_setup_per_batch_and_the_speedup_after_it(self):
    # 10 batches: 0.40 s of baseline, 0.06 of it set-up; 0.26 s of
    # speculative decoding, 0.07 of it set-up.
    results = _results(run_totals.Seconds(0.40, 0.26, 0.06, 0.07, batches=10))
    self.assertAlmostEqual(results["baseline_ms_per_token"], 2.5)
    self.assertAlmostEqual(results["speculative_ms_per_token"], 1.625)
    self.assertAlmostEqual(results["speedup"], 0.40 / 0.26)
    self.assertAlmostEqual(results["baseline_setup_ms"], 6.0)
    self.assertAlmostEqual(results["speculative_setup_ms"], 7.0)
    # (0.40 - 0.06) / (0.26 - 0.07), both over the same 160 tokens.
    self.assertAlmostEqual(results["speedup_after_setup"], 0.34 / 0.19)

  def test_tokens_per_decoder_weigh_the_speedup_after_setup(self):
    totals = _totals()
    totals.speculative_tokens = 80
    results = run_totals.results(
        totals,
        run_totals.Seconds(0.40, 0.26, 0.06, 0.07, batches=10),
        call_costs.StepCosts(0.002, 0.0026, 0.00006),
        gamma=3,
        config=sampling.SamplingConfig(temperature=0.0),
        num_examples=10,
        num_truncated=0,
    )
    self.assertAlmostEqual(
        results["speedup_after_setup"], (0.34 / 160) / (0.19 / 80)
    )


if __name__ == "__main__":
  absltest.main()
