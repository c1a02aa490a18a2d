"""Tests for spec_decode.alpha_report: estimates kept as they come."""

import json
import pathlib
import tempfile

from absl.testing import absltest

from spec_decode import alpha_report
from spec_decode import teacher_forced


def _estimates(num):
  return [
      teacher_forced.AlphaEstimate(t, 0.5 + 0.1 * t, 0.01, 100, 10)
      for t in range(num)
  ]


def _fake_measure(stop_after=None):
  """A measure of two temperatures; Ctrl-C after `stop_after` estimates."""

  def measure(on_estimate):
    for index, estimate in enumerate(_estimates(2)):
      if index == stop_after:
        raise KeyboardInterrupt
      on_estimate(estimate)
    return _estimates(2)

  return measure


class KeptEstimatesTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.output = pathlib.Path(tempfile.mkdtemp()) / "alpha.json"

  def _written(self):
    return [
        (r["temperature"], r["alpha"])
        for r in json.loads(self.output.read_text())
    ]

  def test_every_estimate_is_written(self):
    estimates = alpha_report.kept_estimates(
        _fake_measure(), 2, str(self.output)
    )
    self.assertEqual(estimates, _estimates(2))
    self.assertEqual(self._written(), [(0, 0.5), (1, 0.6)])

  def test_ctrl_c_keeps_the_estimates_made(self):
    with self.assertRaisesRegex(
        KeyboardInterrupt,
        f"^after 1 of 2 temperatures; they are in {self.output}$",
    ):
      alpha_report.kept_estimates(
          _fake_measure(stop_after=1), 2, str(self.output)
      )
    self.assertEqual(self._written(), [(0, 0.5)])

  def test_ctrl_c_before_any_estimate_is_passed_on(self):
    with self.assertRaisesRegex(KeyboardInterrupt, "^$"):
      alpha_report.kept_estimates(
          _fake_measure(stop_after=0), 2, str(self.output)
      )
    self.assertFalse(self.output.exists())


if __name__ == "__main__":
  absltest.main()
