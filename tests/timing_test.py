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


if __name__ == "__main__":
  absltest.main()
