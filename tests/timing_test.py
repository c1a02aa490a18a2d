"""spec_decode.timing: what it runs, in which order, and what it returns."""

from absl.testing import absltest
import jax.numpy as jnp

from spec_decode import timing


class InterleavedMediansTest(absltest.TestCase):

  def test_rounds_rotate_and_every_run_is_timed(self):
    calls = []

    def run(name):
      def call():
        calls.append(name)
        return jnp.zeros(())

      return call

    medians = timing.interleaved_medians(
        {name: run(name) for name in "abc"}, rounds=4
    )
    self.assertEqual(set(medians), set("abc"))
    self.assertTrue(all(value >= 0 for value in medians.values()))
    # A compiling warm-up of each, then rounds starting at a, b, c, a.
    self.assertEqual("".join(calls), "abc" + "abc" + "bca" + "cab" + "abc")

  def test_times_hold_each_round_and_the_medians_are_theirs(self):
    def run():
      return jnp.zeros(())

    # perf_counter() before and after each timed call: rounds a b, b a, a b
    # take a 1, b 5; b 2, a 7; a 3, b 9.
    stamps = [0, 1, 1, 6, 6, 8, 8, 15, 15, 18, 18, 27]
    for measure, expected in (
        (timing.interleaved_times, {"a": [1, 7, 3], "b": [5, 2, 9]}),
        (timing.interleaved_medians, {"a": 3, "b": 5}),
    ):
      clock = iter(float(t) for t in stamps)
      with absltest.mock.patch.object(
          timing.time, "perf_counter", lambda clock=clock: next(clock)
      ):
        self.assertEqual(measure({"a": run, "b": run}, rounds=3), expected)


if __name__ == "__main__":
  absltest.main()
