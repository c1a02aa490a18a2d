"""benchmarks/mutations.py stays applicable: every mutation finds its code.

A mutation whose pattern no longer matches stops the benchmark with "pattern
not found" only when someone runs it (one went stale unnoticed when the KV
cache took its current layout). This checks, without running any mutation,
that each pattern matches exactly once in the current checkout and that the
owning test file holds the tests its selection names.
"""

import json
import pathlib
import re
import subprocess
import sys

from absl.testing import absltest

_ROOT = pathlib.Path(__file__).resolve().parent.parent

# The script defines absl flags that clash with spec_decode's (--output), so
# its table is read in a process of its own.
_LIST = """
import dataclasses, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("mutations", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps([dataclasses.asdict(m) for m in module.MUTATIONS]))
"""


def _mutations():
  result = subprocess.run(
      [sys.executable, "-c", _LIST, str(_ROOT / "benchmarks" / "mutations.py")],
      check=True,
      capture_output=True,
      text=True,
  )
  return json.loads(result.stdout)


class MutationsTest(absltest.TestCase):

  def test_every_pattern_matches_once_and_its_tests_exist(self):
    mutations = _mutations()
    self.assertGreaterEqual(len(mutations), 13)
    for m in mutations:
      with self.subTest(m["name"]):
        source = (_ROOT / m["path"]).read_text()
        self.assertLen(re.findall(m["pattern"], source), 1, m["pattern"])
        tests = (_ROOT / m["test"]).read_text()
        for name in re.split(r"\s+(?:or|and|not)\s+", m["select"]):
          if name:
            self.assertIn(name.strip("() "), tests)


if __name__ == "__main__":
  absltest.main()
