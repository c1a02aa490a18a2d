"""spec_decode.report: the run's printed table and its compute-bound note."""

from absl.testing import absltest

from spec_decode import report

import machine_test

# A run's results as compare.run returns them (the keys the table reads).
_RESULTS = dict(
    num_examples=100,
    gamma=4,
    temperature=0.0,
    alpha=0.775,
    alpha_estimate=0.775,
    tokens_per_target_call=2.82,
    baseline_ms_per_token=6.78,
    speculative_ms_per_token=7.42,
    speedup=6.78 / 7.42,
    baseline_setup_ms=5.9,
    speculative_setup_ms=6.1,
    speedup_after_setup=0.88,
    c=0.015,
    target_step_ms=5.29,
    target_verify_ms=16.11,
    draft_step_ms=0.08,
    predicted_speedup=3.02,
    call_cost_speedup=2.82 * 5.29 / (4 * 0.08 + 16.11),
    optimal_gamma=11,
    mismatches=0,
    num_truncated=0,
    nonfinite_rows=0,
    machine=machine_test.CPU_MACHINE,
)


class FormatResultsTest(absltest.TestCase):

  def test_machine_comes_first(self):
    lines = report.format_results(_RESULTS).splitlines()
    self.assertEqual(
        lines[0].split(),
        ["machine", "cpu:", "AMD", "EPYC,", "2", "CPUs,", "L3", "16384K"],
    )
    self.assertEqual(lines[1].split(), ["examples", "100"])

  def test_the_call_cost_range_follows_the_prediction(self):
    results = dict(_RESULTS, call_cost_speedup_range=[0.84375, 1.0625])
    lines = report.format_results(results).splitlines()
    at = lines.index(f"{'  with the measured call costs':<45} 0.91x")
    label = "    in the call costs' timed rounds"
    self.assertEqual(lines[at + 1], f"{label:<45} 0.84-1.06x")

  def test_no_range_row_without_timed_rounds(self):
    self.assertNotIn("timed rounds", report.format_results(_RESULTS))

  def test_verify_ratio_row(self):
    text = report.format_results(_RESULTS)
    self.assertIn(
        f"{'target (gamma+1)-token call / 1-token call':<45} 3.05", text
    )

  def test_setup_rows_follow_the_measured_speedup(self):
    lines = report.format_results(_RESULTS).splitlines()
    at = [line.split()[0] for line in lines].index("speedup")
    self.assertEqual(lines[at], f"{'speedup (measured)':<45} 0.91x")
    self.assertEqual(
        lines[at + 1 : at + 4],
        [
            f"{'baseline set-up ms / batch (encoder, cache)':<45} 5.90",
            f"{'speculative set-up ms / batch':<45} 6.10",
            f"{'speedup after set-up':<45} 0.88x",
        ],
    )

  def test_compute_bound_note(self):
    # 2.82 tokens per call against a call of 3.05 steps: 0.91x at best.
    note = report.format_results(_RESULTS).splitlines()[-1]
    self.assertTrue(note.startswith("note: here a 5-token target call costs"))
    self.assertIn("3.05 one-token calls and yields 2.82 tokens", note)
    self.assertIsNone(
        report.compute_bound_note(
            dict(_RESULTS, gamma=4, call_cost_speedup=1.0)
        )
    )

  def test_no_note_when_the_calls_allow_a_speedup(self):
    results = dict(_RESULTS, target_verify_ms=7.0)
    results["call_cost_speedup"] = 2.82 * 5.29 / (4 * 0.08 + 7.0)
    text = report.format_results(results)
    self.assertNotIn("note:", text)
    self.assertTrue(text.splitlines()[-1].startswith("rows with non-finite"))

  def test_results_without_machine(self):
    results = dict(_RESULTS)
    del results["machine"]
    self.assertTrue(report.format_results(results).startswith("examples"))


if __name__ == "__main__":
  absltest.main()
