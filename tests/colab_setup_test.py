"""The notebooks' set-up cell (notebooks/colab_setup.py), without network.

Each notebook's first code cell must be exactly the one colab_setup.py
writes. The cell's `set_up` runs in fresh virtualenvs that have no
spec_decode: from a fake source (a local git repository holding a stand-in
package, at a tag; or a wheel of it), and then again once it is installed,
when it must fetch nothing. pip runs with --no-index and without build
isolation, so nothing is downloaded.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile

from absl.testing import absltest
from absl.testing import parameterized

_ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT / "notebooks"))
# No __pycache__ beside the notebooks: their test checks that nothing there
# changes while they run.
sys.dont_write_bytecode = True
import colab_setup  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.dont_write_bytecode = False

# A stand-in spec_decode: gin_config.CONFIG_DIR chosen as the real one
# chooses it, and a MARK that says which commit it came from.
_GIN_CONFIG = (
    "import pathlib\n"
    "_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent\n"
    'CONFIG_DIR = (_PACKAGE_DIR / "configs" if (_PACKAGE_DIR / "configs")'
    '.is_dir() else _PACKAGE_DIR.parent / "configs")\n'
)
# With configs, the wheel carries configs/ in the package, as setup.py's
# build_py puts it (tested on the real wheel by test_real_wheel_carries...).
_SETUP = """
import setuptools
setuptools.setup(
    name="spec_decode",
    version="0.0.1",
    packages={packages},
    package_dir={{"spec_decode.configs": "configs"}},
    package_data={{"spec_decode.configs": ["*.gin"]}},
)
"""
# Runs set_up in a venv; a fetch (any subprocess) is an error when refused.
_DRIVER = """
import json, os, pathlib, subprocess, sys
sys.path.insert(0, {notebooks!r})
if {refuse!r}:
  def refuse(*args, **kwargs):
    raise AssertionError(f"fetched: {{args}}")
  subprocess.run = refuse
import colab_setup
try:
  root = colab_setup.set_up({source!r}, pathlib.Path({checkout!r}), "cpu")
except colab_setup.SetUpError as e:
  print(json.dumps({{"error": str(e)}}))
  sys.exit(0)
import spec_decode
print(json.dumps({{"root": str(root), "mark": spec_decode.MARK}}))
"""


def _git(repo, *args):
  subprocess.run(
      ["git", "-C", str(repo), *args],
      check=True,
      capture_output=True,
      env=dict(
          os.environ,
          GIT_AUTHOR_NAME="t",
          GIT_AUTHOR_EMAIL="t@t",
          GIT_COMMITTER_NAME="t",
          GIT_COMMITTER_EMAIL="t@t",
      ),
  )


class ColabSetupTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = pathlib.Path(tempfile.mkdtemp())
    # One fresh venv (pip and setuptools, no spec_decode), copied per test.
    cls.base_venv = cls.tmp / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", str(cls.base_venv)],
        check=True,
        capture_output=True,
    )

  def setUp(self):
    super().setUp()
    self.dir = pathlib.Path(tempfile.mkdtemp(dir=self.tmp))
    self.venv = self.dir / "venv"
    shutil.copytree(self.base_venv, self.venv, symlinks=True)

  def _package(self, with_configs_package):
    """The stand-in's source tree; a git repository, MARK 'v1' at tag v1."""
    repo = self.dir / "source"
    (repo / "spec_decode").mkdir(parents=True)
    (repo / "configs").mkdir()
    (repo / "configs" / "demo.gin").write_text("run.gamma = 4\n")
    packages = ["spec_decode"]
    if with_configs_package:  # Ships configs/ inside the wheel's package.
      packages.append("spec_decode.configs")
    (repo / "setup.py").write_text(_SETUP.format(packages=packages))
    (repo / "spec_decode" / "gin_config.py").write_text(_GIN_CONFIG)
    init = repo / "spec_decode" / "__init__.py"
    init.write_text('MARK = "v1"\n')
    _git(repo, "init", "--quiet")
    _git(repo, "add", ".")
    _git(repo, "commit", "--quiet", "-m", "v1")
    _git(repo, "tag", "v1")
    init.write_text('MARK = "later"\n')
    _git(repo, "commit", "--quiet", "-am", "later")
    return repo

  def _wheel(self, source):
    """Builds a wheel of the source tree `source`, offline; its path."""
    wheels = self.dir / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
        + [
            "--no-index",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("*.whl")
    return wheel

  def _set_up(self, source, refuse=False):
    """set_up in the venv, in a fresh process; its JSON report."""
    driver = _DRIVER.format(
        notebooks=str(_ROOT / "notebooks"),
        refuse=refuse,
        source=source,
        checkout=str(self.dir / "checkout"),
    )
    env = dict(
        os.environ,
        PYTHONDONTWRITEBYTECODE="1",
        PIP_NO_INDEX="1",
        # pip reads this variable backwards: "0" turns isolation off.
        PIP_NO_BUILD_ISOLATION="0",
        # The venv's setuptools (ensurepip's) cannot build an editable wheel
        # without the `wheel` package: `setup.py develop` instead.
        PIP_USE_PEP517="0",
    )
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [str(self.venv / "bin" / "python"), "-c", driver],
        capture_output=True,
        text=True,
        check=False,
        cwd=self.dir,
        env=env,
    )
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    return json.loads(done.stdout.splitlines()[-1])

  def test_notebooks_hold_the_cell(self):
    cell = colab_setup.cell_source()
    for name in colab_setup.NOTEBOOKS:
      notebook = json.loads((_ROOT / "notebooks" / name).read_text())
      first = colab_setup.first_code_cell(notebook)
      self.assertEqual(
          "".join(first["source"]),
          cell,
          f"{name}: run python notebooks/colab_setup.py",
      )
    # One place sets the source, and it is a real one or none at all.
    self.assertEqual(cell.count("\nSOURCE = "), 1)
    self.assertIn(f"\nSOURCE = {colab_setup.SOURCE!r}\n", cell)

  def test_git_source_then_installed(self):
    repo = self._package(with_configs_package=False)
    report = self._set_up(f"file://{repo}@v1")
    checkout = self.dir / "checkout"
    self.assertEqual(report, {"root": str(checkout), "mark": "v1"})
    # A new process (Colab after a restart, or the cell run again) finds the
    # editable install; with the source gone, nothing may be fetched.
    shutil.rmtree(repo)
    report = self._set_up(f"file://{repo}@v1", refuse=True)
    self.assertEqual(report, {"root": str(checkout), "mark": "v1"})

  @parameterized.parameters(True, False)
  def test_wheel_source(self, with_configs_package):
    repo = self._package(with_configs_package)
    _git(repo, "checkout", "--quiet", "v1")
    wheel = self._wheel(repo)
    report = self._set_up(str(wheel))
    if with_configs_package:
      # The notebooks work from a directory where configs/ and spec_decode/
      # stand as in a checkout, linked into the installed package.
      work = self.dir / "checkout"
      self.assertEqual(report, {"root": str(work), "mark": "v1"})
      site = next((self.venv / "lib").glob("python*/site-packages"))
      self.assertEqual(
          (work / "configs" / "demo.gin").read_text(), "run.gamma = 4\n"
      )
      self.assertEqual(
          (work / "spec_decode").resolve(), (site / "spec_decode").resolve()
      )
    else:  # Installed, but the notebooks need configs/: a one-line refusal.
      self.assertIn("has no configs", report["error"])
      self.assertIn("use a git SOURCE", report["error"])
      self.assertNotIn("\n", report["error"])

  def test_real_wheel_carries_the_configs_and_kernel_source(self):
    # setup.py's build_py copies configs/ into the package: from the wheel,
    # unpacked as pip installs it, the cell's working directory holds every
    # file the demo config names.
    source = self.dir / "source"
    source.mkdir()
    shutil.copy(_ROOT / "setup.py", source)
    for name in ("spec_decode", "configs"):
      shutil.copytree(
          _ROOT / name,
          source / name,
          ignore=shutil.ignore_patterns("__pycache__"),
      )
    wheel = self._wheel(source)
    site = self.dir / "site"
    with zipfile.ZipFile(wheel) as archive:
      archive.extractall(site)
    script = textwrap.dedent(f"""
        import json, pathlib, re, sys
        sys.path.insert(0, {str(_ROOT / "notebooks")!r})
        import colab_setup
        root = colab_setup.set_up(None, pathlib.Path({str(self.dir / "work")!r}), "cpu")
        import spec_decode
        from spec_decode.kernels import few_rows
        demo = (root / "configs" / "demo.gin").read_text()
        paths = re.findall(r"'(spec_decode/[^']+)'", demo)
        print(json.dumps({{
            "package": spec_decode.__file__,
            "root": str(root),
            "paths": {{p: (root / p).exists() for p in paths}},
            "kernel_source": few_rows._SOURCE.is_file(),
        }}))
    """)
    done = subprocess.run(
        [sys.executable, "-B", "-c", script],
        capture_output=True,
        text=True,
        check=False,
        cwd=self.dir,
        env=dict(os.environ, PYTHONPATH=str(site)),
    )
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    report = json.loads(done.stdout.splitlines()[-1])
    self.assertStartsWith(report["package"], str(site))
    self.assertEqual(report["root"], str(self.dir / "work"))
    # The demo's checkpoints and vocabulary, all found.
    self.assertGreaterEqual(len(report["paths"]), 3)
    self.assertEqual(set(report["paths"].values()), {True}, report["paths"])
    # The CPU kernel's source, which the demo's target compiles on first use.
    self.assertTrue(report["kernel_source"])

  def test_installed_package_fetches_nothing(self):
    # The project's own venv has spec_decode: the whole cell runs, and any
    # subprocess (git, pip) fails it.
    cell = colab_setup.cell_source().replace(
        "SOURCE = None", "SOURCE = 'file:///nonexistent@main'"
    )
    script = textwrap.dedent("""
        import subprocess, sys
        def refuse(*args, **kwargs):
          raise AssertionError(f"fetched: {args}")
        subprocess.run = refuse
        exec(compile(sys.stdin.read(), "cell", "exec"), {})
        import os, spec_decode
        print(os.getcwd() == os.path.dirname(os.path.dirname(
            spec_decode.__file__)))
    """)
    done = subprocess.run(
        [sys.executable, "-B", "-c", script],
        input=cell,
        capture_output=True,
        text=True,
        check=False,
        cwd=self.dir,
    )
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    shown, same_dir = done.stdout.splitlines()[-2:]
    self.assertStartsWith(shown, "spec_decode in ")
    self.assertIn("CpuDevice", shown)
    self.assertEqual(same_dir, "True")

  @parameterized.parameters(
      (None, "SOURCE is not set"),
      ("", "SOURCE is not set"),
      ("https://example.org/spec_decode.git", "needs a ref"),
      ("git@example.org:o/spec_decode.git", "needs a ref"),
  )
  def test_bad_source(self, source, message):
    calls = []
    with self.assertRaisesRegex(colab_setup.SetUpError, message):
      colab_setup.install(source, self.dir / "checkout", run=calls.append)
    self.assertEmpty(calls)

  @parameterized.parameters(
      ("tpu", "jax[tpu]"), ("gpu", "jax[cuda12]"), ("cpu", None)
  )
  def test_jax_for_the_runtime(self, device, extra):
    calls = []
    colab_setup.jax_for(device, run=lambda argv, check: calls.append(argv))
    if extra is None:
      self.assertEmpty(calls)
      return
    setup = (_ROOT / "setup.py").read_text()
    pin = setup.split('"jax==', 1)[1].split('"', 1)[0]
    (argv,) = calls
    self.assertEqual(argv[:4], [sys.executable, "-m", "pip", "install"])
    self.assertEqual(argv[-1], f"{extra}=={pin}")

  def test_accelerator(self):
    with absltest.mock.patch.object(
        colab_setup.glob,
        "glob",
        lambda p: ["/dev/vfio/0"] if "vfio" in p else [],
    ):
      self.assertEqual(colab_setup.accelerator(), "tpu")
    with absltest.mock.patch.object(colab_setup.glob, "glob", lambda p: []):
      with absltest.mock.patch.object(
          colab_setup.shutil, "which", lambda name: "/usr/bin/" + name
      ):
        self.assertEqual(colab_setup.accelerator(), "gpu")
      with absltest.mock.patch.object(
          colab_setup.shutil, "which", lambda name: None
      ):
        self.assertEqual(colab_setup.accelerator(), "cpu")


if __name__ == "__main__":
  absltest.main()
