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

  def test_the_call_cost_range_spans_the_timed_rounds(self):
    rounds = (
        call_costs.StepCosts(0.002, 0.0026, 0.00006),
        call_costs.StepCosts(0.0021, 0.0024, 0.00005),
        call_costs.StepCosts(0.0019, 0.0027, 0.00007),
    )
    results = run_totals.results(
        _totals(),
        run_totals.Seconds(0.40, 0.26, 0.06, 0.07, batches=10),
        call_costs.StepCosts(0.002, 0.0026, 0.00006, rounds=rounds),
        gamma=3,
        config=sampling.SamplingConfig(temperature=0.0),
        num_examples=10,
        num_truncated=0,
    )
    # 160 tokens in 60 target calls; each round's own prediction.
    speedups = [
        (160 / 60) * r.target_step / (3 * r.draft_step + r.target_verify)
        for r in rounds
    ]
    low, high = results["call_cost_speedup_range"]
    self.assertAlmostEqual(low, speedups[2], places=12)
    self.assertAlmostEqual(high, speedups[1], places=12)
    self.assertAlmostEqual(results["call_cost_speedup"], speedups[0], places=12)

  def test_no_range_without_timed_rounds(self):
    results = _results(run_totals.Seconds(0.40, 0.26, 0.06, 0.07, batches=10))
    self.assertIsNone(results["call_cost_speedup_range"])


if __name__ == "__main__":
  absltest.main()
