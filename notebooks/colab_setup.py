r"""The notebooks' set-up cell, kept here once and written into each notebook.

  python notebooks/colab_setup.py   # rewrites both notebooks' set-up cell

Everything between the two `# --- set-up cell ---` lines below is the first
code cell of both notebooks, followed by `os.chdir(set_up(SOURCE))`.
tests/colab_setup_test.py checks that the notebooks hold exactly that, and
runs `set_up` on a fake source (a local git repository and a wheel) and on
an installed package, without network.

SOURCE is the one place that says where Colab gets spec_decode: a git URL
with a ref (`https://github.com/<owner>/spec_decode.git@<branch, tag or
commit>`) or a wheel (a path or URL ending in `.whl`). It is None while the
project has no public address: the cell then asks the user to set it. Once
the repository is published, set SOURCE below and run this script.
"""

import json

# --- set-up cell ---
# Set-up: where spec_decode is not installed (a fresh Colab runtime), install
# it from SOURCE, with the jax build for the runtime's TPU or GPU; where it is
# installed, fetch nothing. Then work from the repository root (for a wheel,
# a directory that links its configs/ and spec_decode/ as a checkout has them).
import glob
import importlib
import importlib.metadata
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

# A git URL with a ref, "https://github.com/<owner>/spec_decode.git@<ref>",
# or a wheel, a path or URL ending in .whl.
SOURCE = None
# Where a git SOURCE goes; for a wheel, the directory the notebook works in.
CHECKOUT = pathlib.Path("/content/spec_decode")


class SetUpError(RuntimeError):
  """A source the cell cannot install from; the message says what to do."""


def accelerator():
  """'tpu', 'gpu' or 'cpu': the runtime's devices, read from the machine."""
  if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
    return "tpu"
  return "gpu" if shutil.which("nvidia-smi") else "cpu"


def install(source, checkout, run=subprocess.run):
  """Installs spec_decode from `source`; returns what to add to sys.path."""
  pip = [sys.executable, "-m", "pip", "install", "--quiet"]
  if not source:
    raise SetUpError(
        "spec_decode is not installed and SOURCE is not set: set SOURCE in "
        "this cell to a git URL with a ref (https://.../spec_decode.git@main)"
        " or a wheel (.whl)"
    )
  if source.endswith(".whl"):
    run([*pip, source], check=True)
    return None
  url, _, ref = source.rpartition("@")
  if not url or not ref or ":" in ref:
    raise SetUpError(
        f"SOURCE {source!r}: a git URL needs a ref after '@' (a branch, tag "
        "or commit), or give a .whl"
    )
  if not checkout.exists():
    git = ["git", "-C", str(checkout)]
    checkout.mkdir(parents=True)
    run([*git, "init", "--quiet"], check=True)
    run([*git, "fetch", "--quiet", "--depth=1", url, ref], check=True)
    run([*git, "checkout", "--quiet", "FETCH_HEAD"], check=True)
  run([*pip, "-e", str(checkout)], check=True)
  return str(checkout)


def jax_for(device, run=subprocess.run):
  """Installs the jax build for a TPU or GPU, at spec_decode's jax pin."""
  extra = {"tpu": "tpu", "gpu": "cuda12"}.get(device)
  if extra:
    version = importlib.metadata.version("jax")
    run(
        [sys.executable, "-m", "pip", "install", "--quiet"]
        + [f"jax[{extra}]=={version}"],
        check=True,
    )


def set_up(source, checkout=CHECKOUT, device=None, run=subprocess.run):
  """Makes spec_decode importable; returns the repository root."""
  if importlib.util.find_spec("spec_decode") is None:
    path = install(source, checkout, run)
    jax_for(device or accelerator(), run)
    if path:  # An editable install is on sys.path from the next start on.
      sys.path.insert(0, path)
    importlib.invalidate_caches()
  from spec_decode import gin_config  # pylint: disable=g-import-not-at-top

  configs = gin_config.CONFIG_DIR
  package = pathlib.Path(gin_config.__file__).resolve().parent
  if not configs.is_dir():
    raise SetUpError(
        f"spec_decode at {package} has no configs (a wheel built without "
        "them): use a git SOURCE or a newer wheel"
    )
  if configs == package.parent / "configs":  # A checkout.
    return package.parent
  # A wheel carries configs/ inside the package: work from a directory that
  # links configs/ and spec_decode/ where a checkout has them.
  checkout.mkdir(parents=True, exist_ok=True)
  for name, target in (("configs", configs), ("spec_decode", package)):
    if not (checkout / name).exists():
      (checkout / name).symlink_to(target, target_is_directory=True)
  return checkout


# --- set-up cell ---

NOTEBOOKS = ("speculative_decoding.ipynb", "acceptance_analysis.ipynb")
_MARK = "# --- set-up cell ---\n"
# The cell's last lines. Greedy speculative decoding equals the greedy
# baseline only if a (gamma+1)-token call rounds as 1-token calls do: full
# float32 matmuls on GPU (TF32 by default) and TPU (bfloat16 passes), set
# before jax is imported; on CPU they are the default.
_CALL = """
ROOT = set_up(SOURCE)
os.chdir(ROOT)
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
from spec_decode import gin_config

print(f"spec_decode in {ROOT}; jax {jax.__version__} on {jax.devices()}")
"""


def cell_source():
  """The set-up cell's text, from this file."""
  text = pathlib.Path(__file__).read_text()
  _, body, _ = text.split(_MARK)
  return body.strip() + "\n" + _CALL


def first_code_cell(notebook):
  return next(c for c in notebook["cells"] if c["cell_type"] == "code")


def write_notebooks(directory=pathlib.Path(__file__).parent):
  """Puts cell_source() into each notebook's first code cell."""
  source = cell_source().splitlines(keepends=True)
  for name in NOTEBOOKS:
    path = directory / name
    notebook = json.loads(path.read_text())
    first_code_cell(notebook)["source"] = source
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
  write_notebooks()
