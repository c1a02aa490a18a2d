"""The fake PATH that launch/tpu_vm.py's tests run it with, and its dry runs.

The dry runs run with a PATH whose only commands are fakes that leave a mark,
so a dry run that called gcloud (or anything else) fails the test. The
`python -m spec_decode.run` command each one prints is parsed back with
shlex, and its gin files and bindings are parsed with gin as run.py would,
so the launcher cannot drift from the configs or the run's configurables.
"""

import os
import pathlib
import shlex
import stat
import subprocess
import sys
import tempfile

from absl.testing import parameterized
import gin

from spec_decode import gin_config

# What run.py imports, for the configurables a run binds.
# pylint: disable=unused-import,g-bad-import-order
from spec_decode import compare
from spec_decode import data
from spec_decode import distributed
from spec_decode import partitioning
from spec_decode import vocabulary

# pylint: enable=unused-import,g-bad-import-order

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "launch" / "tpu_vm.py"
TPU_VM = ["gcloud", "compute", "tpus", "tpu-vm"]
WRITE_SCOPE = "--scopes=https://www.googleapis.com/auth/cloud-platform"
_FAKES = ("gcloud", "gsutil", "git", "tar", "bash", "sh", "mkdir", "ssh", "scp")


def after(argv, prefix):
  """The values of every `prefix...` argument, prefix removed."""
  return [a[len(prefix) :] for a in argv if a.startswith(prefix)]


def _run_commands(command):
  """Each `python -m spec_decode.run` in a shell command: (files, bindings)."""
  words = shlex.split(command)
  runs = []
  for i in range(len(words) - 2):
    if words[i + 1 : i + 3] == ["-m", "spec_decode.run"]:
      args = []
      for word in words[i + 3 :]:
        if word in ("&&", "||", ";", "|"):
          break
        args.append(word)
      unknown = [
          a
          for a in args
          if not a.startswith(("--gin_file=", "--gin_bindings="))
      ]
      if unknown:
        raise AssertionError(f"unexpected spec_decode.run args {unknown}")
      runs.append((after(args, "--gin_file="), after(args, "--gin_bindings=")))
  return runs


class LaunchTestCase(parameterized.TestCase):
  """Runs the launcher on a PATH of fakes that must not be called."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = pathlib.Path(tempfile.mkdtemp())
    cls.fake_bin = cls.tmp / "bin"
    cls.fake_bin.mkdir()
    cls.mark = cls.tmp / "called"
    for fake in _FAKES:
      path = cls.fake_bin / fake
      path.write_text(f'#!/bin/sh\necho "{fake} $*" >> "{cls.mark}"\nexit 1\n')
      path.chmod(path.stat().st_mode | stat.S_IXUSR)
    cls.empty_bin = cls.tmp / "empty"
    cls.empty_bin.mkdir()

  def tearDown(self):
    gin.clear_config()
    if self.mark.exists():
      self.fail(f"the launcher ran commands: {self.mark.read_text()}")
    super().tearDown()

  def _launch(self, *args, path=None):
    env = dict(os.environ, PATH=str(path or self.fake_bin))
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=self.tmp,  # Not the repository: paths come from the script's.
        env=env,
    )

  def _dry_run(self, *args):
    done = self._launch("--dry_run", *args)
    self.assertEqual(done.returncode, 0, done.stderr)
    return [
        shlex.split(line)
        for line in done.stdout.splitlines()
        if line and not line.startswith("#")
    ]

  def _parse_run(self, commands):
    """The one spec_decode.run command, run on every worker; parsed."""
    runs = [
        (argv, run)
        for argv in commands
        for command in after(argv, "--command=")
        for run in _run_commands(command)
    ]
    self.assertLen(runs, 1)
    argv, (files, bindings) = runs[0]
    self.assertEqual(argv[:5], TPU_VM + ["ssh"])
    self.assertIn("--worker=all", argv)
    self.assertNotEmpty(files)
    # The worker runs it from the repository's root.
    files = [str(ROOT / f) if (ROOT / f).is_file() else f for f in files]
    gin_config.parse(files, bindings)
    return argv
