"""The shell launch/tpu_vm.py writes, run against a scripted gcloud or apt-get.

The queue step's commands, the wait for a queued resource, the delete that
finds out what to delete, --delete_after after a failed queue, and apt's wait
for its lock.
"""

import pathlib
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

import launch_fakes

sys.path.insert(0, str(launch_fakes.SCRIPT.parent))
import commands as launch_commands  # pylint: disable=g-import-not-at-top,wrong-import-position

_TPU_VM = launch_fakes.TPU_VM
_QUEUED = ["gcloud", "compute", "tpus", "queued-resources"]
_WRITE_SCOPE = launch_fakes.WRITE_SCOPE
_after = launch_fakes.after


class LaunchShellTest(launch_fakes.LaunchTestCase):

  def test_queue(self):
    commands = self._dry_run(
        "--config=v5e-8",
        "--steps=queue,install,run,fetch",
        "--delete_after",
        "--spot",
        "--output_dir=gs://my-bucket/runs",
    )
    name = "spec-decode-v5e-8"
    queue, wait = commands[:2]
    self.assertEqual(queue[:6], _QUEUED + ["create", name])
    self.assertEqual(_after(queue, "--node-id="), [name])
    self.assertEqual(
        _after(queue, "--runtime-version="), ["v2-alpha-tpuv5-lite"]
    )
    self.assertEmpty(_after(queue, "--version="))
    self.assertEqual(_after(queue, "--accelerator-type="), ["v5litepod-8"])
    self.assertEqual(_after(queue, "--zone="), ["us-central1-a"])
    self.assertIn("--spot", queue)
    self.assertIn(_WRITE_SCOPE, queue)
    self.assertEqual(wait[:2], ["bash", "-c"])
    self.assertFalse([a for a in commands if a[:5] == _TPU_VM + ["create"]])
    # The later steps find the node under the same name.
    self.assertEqual(self._parse_run(commands)[5], name)
    # Cleaned up: the queued resource, and with --force its node.
    self.assertEqual(
        commands[-1],
        _QUEUED
        + ["delete", name, "--zone=us-central1-a", "--force", "--quiet"],
    )

  def _scripted(self, gcloud_script):
    """A PATH with bash and a few tools, a no-op sleep, a scripted gcloud."""
    bin_dir = pathlib.Path(tempfile.mkdtemp(dir=self.tmp))
    calls = bin_dir / "calls"
    scripts = {
        "gcloud": f'echo "gcloud $*" >> "{calls}"\n{gcloud_script}',
        "sleep": f'echo "sleep $*" >> "{calls}"',
    }
    for name, body in scripts.items():
      path = bin_dir / name
      path.write_text(f"#!/bin/bash\n{body}\n")
      path.chmod(path.stat().st_mode | stat.S_IXUSR)
    for tool in ("bash", "dirname", "env", "grep", "sed"):
      (bin_dir / tool).symlink_to(shutil.which(tool))
    return bin_dir, calls

  def _run_shell(self, argv, bin_dir):
    return subprocess.run(
        argv,
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        check=False,
        cwd=self.tmp,
    )

  @parameterized.parameters(
      (["WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"], 0),
      (["ACCEPTED", "WAITING_FOR_RESOURCES", "FAILED"], 1),
      (["PROVISIONING", "SUSPENDED"], 1),
  )
  def test_queue_wait(self, states, returncode):
    (wait,) = [
        a
        for a in self._dry_run("--config=v4-8", "--steps=queue")
        if a[:2] == ["bash", "-c"]
    ]
    # The n-th describe prints the n-th state.
    states_file = self.tmp / "states"
    states_file.write_text("\n".join(states) + "\n")
    bin_dir, calls = self._scripted(
        f'n=$(grep -c describe "$(dirname "$0")/calls"); '
        f'sed -n "${{n}}p" "{states_file}"'
    )
    done = self._run_shell(wait, bin_dir)
    self.assertEqual(done.returncode, returncode, done.stderr)
    lines = calls.read_text().splitlines()
    describes = [l for l in lines if l.startswith("gcloud")]
    self.assertLen(describes, len(states))
    self.assertEqual(
        shlex.split(describes[0]),
        _QUEUED
        + [
            "describe",
            "spec-decode-v4-8",
            "--zone=us-central2-b",
            "--format=value(state.state)",
        ],
    )
    # A pause between two looks, none after the last.
    self.assertLen([l for l in lines if l.startswith("sleep")], len(states) - 1)

  @parameterized.parameters((0, "queued-resources"), (1, "tpu-vm"))
  def test_delete_finds_what_to_delete(self, describe_status, kind):
    (delete,) = self._dry_run("--config=v4-8", "--steps=delete")
    bin_dir, calls = self._scripted(
        f'[ "$4" = describe ] && exit {describe_status}; exit 0'
    )
    done = self._run_shell(delete, bin_dir)
    self.assertEqual(done.returncode, 0, done.stderr)
    _, deleted = [shlex.split(l) for l in calls.read_text().splitlines()]
    self.assertEqual(
        deleted[:6],
        ["gcloud", "compute", "tpus", kind, "delete", "spec-decode-v4-8"],
    )
    self.assertEqual("--force" in deleted, kind == "queued-resources")

  @parameterized.parameters(
      # A failed queued-resources create may be another's name: no delete.
      ('[ "$4" = create ] && exit 1; exit 0', ["create"]),
      # A queued resource that FAILED is deleted, with its node.
      (
          '[ "$4" = describe ] && echo FAILED; exit 0',
          ["create", "describe", "delete"],
      ),
  )
  def test_queue_failure_with_delete_after(self, gcloud_script, verbs):
    bin_dir, calls = self._scripted(gcloud_script)
    done = self._launch(
        "--config=v4-8", "--steps=queue", "--delete_after", path=bin_dir
    )
    self.assertEqual(done.returncode, 1)
    self.assertEqual(
        done.stderr.splitlines()[-1].split(" failed")[0], "error: queue"
    )
    called = [shlex.split(l) for l in calls.read_text().splitlines()]
    self.assertEqual([c[3] for c in called], ["queued-resources"] * len(verbs))
    self.assertEqual([c[4] for c in called], verbs)
    if "delete" in verbs:
      self.assertIn("--force", called[-1])

  @parameterized.parameters((2, 0), (launch_commands.APT_UPDATE_TRIES, 1))
  def test_apt_waits_for_its_lock(self, update_failures, returncode):
    # The install command's apt part, on a VM whose apt lists lock is held
    # for the first `update_failures` tries; dpkg's lock is apt-get's to wait
    # for (its DPkg::Lock::Timeout option).
    (install,) = [
        c
        for a in self._dry_run("--config=v4-8", "--steps=install")
        for c in _after(a, "--command=")
    ]
    apt_part = launch_commands.apt_python("python3.11")
    self.assertTrue(install.startswith(apt_part + " && "))
    bin_dir, calls = self._scripted("exit 1")
    fakes = {
        "python3.11": "exit 1",  # No ensurepip: Python 3.11 is missing.
        "sudo": f'echo "sudo $*" >> "{calls}"; exec env "$@"',
        "apt-get": (
            f'[ "$3" = update ] && [ $(grep -c " update" "{calls}") -le '
            f"{update_failures} ] && echo 'E: Could not get lock "
            "/var/lib/apt/lists/lock' >&2 && exit 100; exit 0"
        ),
    }
    for name, body in fakes.items():
      path = bin_dir / name
      path.write_text(f"#!/bin/bash\n{body}\n")
      path.chmod(path.stat().st_mode | stat.S_IXUSR)
    done = self._run_shell(["bash", "-c", apt_part], bin_dir)
    self.assertEqual(done.returncode, returncode, done.stderr)
    lines = calls.read_text().splitlines()
    updates = [l for l in lines if l.endswith(" update -qq")]
    installs = [l for l in lines if " install " in l]
    timeout = f"-o DPkg::Lock::Timeout={launch_commands.APT_LOCK_TIMEOUT_S}"
    for line in updates + installs:
      self.assertIn(f"apt-get {timeout} ", line)
    if returncode == 0:
      self.assertLen(updates, update_failures + 1)
      self.assertEqual(
          installs,
          [
              f"sudo DEBIAN_FRONTEND=noninteractive apt-get {timeout} "
              "install -y -qq python3.11 python3.11-venv"
          ],
      )
    else:
      self.assertLen(updates, launch_commands.APT_UPDATE_TRIES)
      self.assertEmpty(installs)
    self.assertLen(
        [l for l in lines if l.startswith("sleep")], len(updates) - 1
    )


if __name__ == "__main__":
  absltest.main()
