"""The notebooks run headless, top to bottom, and leave the repository alone.

Each runs in a fresh `python3` kernel (this interpreter's ipykernel) started
in a temporary directory; its setup cell moves to the repository root, and
its outputs go to temporary directories. Outside Colab the setup cell
installs nothing, so the notebooks need no network. Both take about two
minutes on 2 CPU cores, mostly compiling.
"""

import pathlib
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import nbclient
import nbformat

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_NOTEBOOKS = ("speculative_decoding.ipynb", "acceptance_analysis.ipynb")
# The longest cell, the gamma sweep, takes about a minute.
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
    with tempfile.TemporaryDirectory() as cwd:
      # Raises CellExecutionError, with the cell and its traceback, if any
      # cell fails.
      nbclient.NotebookClient(
          notebook,
          kernel_name="python3",
          timeout=_CELL_TIMEOUT_S,
          resources={"metadata": {"path": cwd}},
      ).execute()
    self.assertEqual(_snapshot(), before)
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
