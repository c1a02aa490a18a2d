"""The notebooks run headless, top to bottom, and leave the repository alone.

Each runs in a fresh `python3` kernel (this interpreter's ipykernel) started
in a temporary directory; its setup cell moves to the repository root, and
its outputs go to temporary directories. Outside Colab the setup cell
installs nothing, so the notebooks need no network. On 2 CPU cores the
walkthrough takes about 2 minutes (its gamma sweep runs the 48.2M target)
and the acceptance analysis under one.
"""

import json
import pathlib
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import nbclient
import nbformat

import run_test

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_NOTEBOOKS = ("speculative_decoding.ipynb", "acceptance_analysis.ipynb")
# The longest cell, the gamma sweep, takes up to about two minutes.
_CELL_TIMEOUT_S = 600
# Where a notebook could write by mistake: compare.run's default output_dir
# (results/demo) and beside itself.
_WATCHED = ("results", "notebooks")


def _read(name):
  return nbformat.read(_ROOT / "notebooks" / name, as_version=4)


def _snapshot():
  """The watched files' modification times, and the root's entries."""
  files = {
      path: path.stat().st_mtime_ns
      for directory in _WATCHED
      for path in (_ROOT / directory).rglob("*")
      if path.is_file()
  }
  return files, sorted(path.name for path in _ROOT.iterdir())


def _execute(notebook, probe):
  """Runs `notebook` in place, then `probe` in its kernel; returns its JSON.

  Raises CellExecutionError, with the cell and its traceback, if any cell
  fails.
  """
  with tempfile.TemporaryDirectory() as cwd:
    client = nbclient.NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=_CELL_TIMEOUT_S,
        resources={"metadata": {"path": cwd}},
    )
    with client.setup_kernel():
      for index, cell in enumerate(notebook.cells):
        client.execute_cell(cell, index)
      cell = nbformat.v4.new_code_cell(probe)
      notebook.cells.append(cell)
      client.execute_cell(cell, len(notebook.cells) - 1)
      cell = notebook.cells[-1]
  text = "".join(o.get("text", "") for o in cell.outputs)
  return json.loads(text.strip().splitlines()[-1])


# Key numbers, read from each notebook's kernel after its last cell.
_PROBES = {
    "speculative_decoding.ipynb": """
import json
print(json.dumps(dict(
    identical=bool(np.array_equal(result.sequences, baseline.sequences)),
    side_by_side_alpha=float(result.acceptance_rate()),
    sweep=[
        {key: r[key] for key in (
            "gamma", "alpha", "alpha_estimate", "mismatches",
            "tokens_per_target_call")}
        for r in sweep
    ],
)))
""",
    "acceptance_analysis.ipynb": """
import json
print(json.dumps({
    name: dict(
        accepted=int(result.accepted_tokens.sum()),
        judged=int(result.drafted_tokens.sum()),
        estimate=float(result.beta_sum.sum() / result.drafted_tokens.sum()),
        by_position=acceptance.rates_by_position(
            list(itertools.chain.from_iterable(blocks[name])), GAMMA
        ).judged.tolist(),
    )
    for name, result in results.items()
}))
""",
}


def _check_speculative_decoding(test, numbers):
  """notebooks/README.md's figures of speedup_vs_gamma.png, greedy."""
  test.assertTrue(numbers["identical"])
  sweep = numbers["sweep"]
  test.assertEqual([r["gamma"] for r in sweep], [1, 2, 4])
  for r, alpha, tokens in zip(sweep, (0.769, 0.767, 0.740), (1.72, 2.23, 2.63)):
    test.assertEqual(r["mismatches"], 0)
    test.assertAlmostEqual(r["alpha"], r["alpha_estimate"], places=9)
    test.assertEqual(round(r["alpha"], 3), alpha, r)
    test.assertEqual(round(r["tokens_per_target_call"], 2), tokens, r)


def _check_acceptance_analysis(test, numbers):
  """notebooks/README.md's figures of acceptance_rates.png, alpha_estimate."""
  greedy, sampled = numbers["greedy"], numbers["temperature 1"]
  test.assertEqual(greedy["judged"], 480)
  test.assertEqual(round(greedy["accepted"] / greedy["judged"], 4), 0.7854)
  test.assertAlmostEqual(
      greedy["accepted"] / greedy["judged"], greedy["estimate"], places=6
  )
  test.assertEqual(greedy["by_position"], [183, 131, 99, 67])
  # Sampled: the empirical rate within its interval of the estimate.
  test.assertGreater(sampled["judged"], 300)
  test.assertLess(
      abs(sampled["accepted"] / sampled["judged"] - sampled["estimate"]),
      run_test.alpha_interval(sampled["judged"]),
  )


_CHECKS = {
    "speculative_decoding.ipynb": _check_speculative_decoding,
    "acceptance_analysis.ipynb": _check_acceptance_analysis,
}


class NotebooksTest(parameterized.TestCase):

  @parameterized.parameters(*_NOTEBOOKS)
  def test_stored_without_outputs(self, name):
    notebook = _read(name)
    nbformat.validate(notebook)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    self.assertNotEmpty(code_cells)
    for cell in code_cells:
      self.assertEqual(cell.outputs, [], cell.id)
      self.assertIsNone(cell.execution_count, cell.id)

  @parameterized.parameters(*_NOTEBOOKS)
  def test_runs_without_errors(self, name):
    notebook = _read(name)
    before = _snapshot()
    numbers = _execute(notebook, _PROBES[name])
    self.assertEqual(_snapshot(), before)
    _CHECKS[name](self, numbers)
    outputs = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    ]
    self.assertTrue(
        any("image/png" in output.get("data", {}) for output in outputs)
    )


if __name__ == "__main__":
  absltest.main()
