"""The code is formatted as pyproject.toml says (pyink: Google style)."""

import pathlib
import subprocess
import sys

from absl.testing import absltest

_ROOT = pathlib.Path(__file__).resolve().parent.parent


class FormatTest(absltest.TestCase):

  def test_pyink_check(self):
    done = subprocess.run(
        [sys.executable, "-m", "pyink", "--check", "--quiet", "."],
        cwd=_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    self.assertEqual(
        done.returncode, 0, f"run `pyink .` to format:\n{done.stderr}"
    )


if __name__ == "__main__":
  absltest.main()
