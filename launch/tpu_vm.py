r"""Runs spec_decode on a Cloud TPU VM: create, install, run, fetch, delete.

  python launch/tpu_vm.py --config=v4-8 --dry_run
  python launch/tpu_vm.py --config=v4-8 --project=my-project --delete_after
  python launch/tpu_vm.py --config=v4-32 --output_dir=gs://my-bucket/runs \
      --gin_bindings="target/checkpoint_path.path='gs://my-bucket/xxl_ende'"

Each step is one or more gcloud commands, printed before they run (and only
printed with --dry_run, which needs neither gcloud nor a project):

  queue    instead of create: `gcloud compute tpus queued-resources create`
           for a node of the launcher's name, then a wait until it is ACTIVE;
  create   `gcloud compute tpus tpu-vm create` (accelerator type from
           --config or --accelerator_type; runtime version and zone from its
           generation's row of launch/tpus.py; write scopes for a gs://
           --output_dir);
  install  on every worker: Python 3.11 (apt, waiting for its lock), this
           repository (this working tree packed and copied with scp, or a git
           clone of --repo), a virtualenv with `pip install -e .
           "jax[tpu]==<setup.py's jax>"`;
  run      on every worker at once (`ssh --worker=all`): `python -m
           spec_decode.run` with the config's gin files, the mesh binding
           `make_mesh.model_parallel`, `initialize_distributed.enabled` (True
           on a slice of several hosts), `run.output_dir` and --gin_bindings;
  fetch    worker 0's results to --output_dir (scp), or from worker 0 to a
           gs:// --output_dir (`gcloud storage cp`);
  delete   the TPU VM, or the queued resource and its node (with
           --delete_after, also when a step after create or queue fails).

A step that fails stops the launch with a one-line error, and so does a bad
flag or a zone that does not offer the accelerator's generation.
"""

import dataclasses
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
import commands
import tpus

ROOT = pathlib.Path(__file__).resolve().parent.parent
STEPS = ("queue", "create", "install", "run", "fetch", "delete")
# On each worker, relative to the home directory.
REMOTE_REPO = "spec_decode"
REMOTE_VENV = "spec_decode_venv"
REMOTE_TARBALL = "spec_decode.tar.gz"


@dataclasses.dataclass(frozen=True)
class Preset:
  """A named launch: what to run, on which accelerator type.

  The zone and runtime version come from the accelerator's generation
  (launch/tpus.py), so --accelerator_type of any generation fits any preset.
  """

  accelerator_type: str
  gin_files: tuple[str, ...]
  description: str


_PAPER_ENDE = ("configs/t5_1_1_xxl_small_ende.gin",)
PRESETS = {
    "v4-8": Preset(
        "v4-8",
        _PAPER_ENDE,
        "the paper's setup: T5 1.1 XXL target, T5 1.1 small draft, WMT En-De",
    ),
    "v5e-8": Preset(
        "v5litepod-8",
        _PAPER_ENDE,
        "the paper's pair on v5e (16 GiB a chip: the target is sharded)",
    ),
    "v4-32": Preset(
        "v4-32",
        _PAPER_ENDE,
        "a multi-host pod slice: 4 hosts, one jax.distributed job",
    ),
}

_CONFIG = flags.DEFINE_string(
    "config", None, f"Preset: one of {', '.join(PRESETS)}."
)
_PROJECT = flags.DEFINE_string(
    "project", None, "Google Cloud project; gcloud's default when unset."
)
_ZONE = flags.DEFINE_string(
    "zone",
    None,
    "Zone; the accelerator generation's default (launch/tpus.py) when unset.",
)
_NAME = flags.DEFINE_string(
    "name", None, "TPU VM name; spec-decode-<config> when unset."
)
_ACCELERATOR_TYPE = flags.DEFINE_string(
    "accelerator_type",
    None,
    "Accelerator type of any generation (v4-16, v5p-8, v5litepod-16, "
    "v6e-8, ...); the preset's when unset.",
)
_RUNTIME_VERSION = flags.DEFINE_string(
    "runtime_version",
    None,
    "TPU software version; the one for the accelerator's generation when "
    "unset.",
)
_SPOT = flags.DEFINE_bool("spot", False, "Create a Spot TPU VM (cheaper).")
_GIN_FILES = flags.DEFINE_multi_string(
    "gin_file",
    None,
    "Gin files, relative to the repository (or to configs/); the preset's "
    "when unset.",
)
_GIN_BINDINGS = flags.DEFINE_multi_string(
    "gin_bindings", [], "Extra gin bindings, applied after the launcher's."
)
_MODEL_PARALLEL = flags.DEFINE_integer(
    "model_parallel",
    None,
    "make_mesh.model_parallel; every chip of the slice when unset.",
)
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir",
    str(ROOT / "results" / "tpu"),
    "Where the results go, in <output_dir>/<name>/: a directory here (copied "
    "from worker 0 with scp) or gs://bucket/path (copied there by worker 0).",
)
_REPO = flags.DEFINE_string(
    "repo",
    "local",
    "'local' (this working tree, copied with scp) or a git URL to clone.",
)
_REF = flags.DEFINE_string(
    "ref", None, "With a git --repo: the branch, tag or commit to check out."
)
_PYTHON = flags.DEFINE_string(
    "python", "python3.11", "The workers' Python; apt-installed if missing."
)
_STEPS = flags.DEFINE_list(
    "steps",
    ["create", "install", "run", "fetch"],
    f"Steps to take, in this order: {', '.join(STEPS)} (queue or create, "
    "not both).",
)
_DELETE_AFTER = flags.DEFINE_bool(
    "delete_after",
    False,
    "Delete the TPU VM (or queued resource) at the end, and when a step "
    "after create or queue fails.",
)
_DRY_RUN = flags.DEFINE_bool(
    "dry_run", False, "Print the commands instead of running them."
)


class LaunchError(ValueError):
  """A bad flag or a failed step: reported as one line."""


@dataclasses.dataclass(frozen=True)
class Command:
  """One command of a launch.

  Attributes:
    step: the step (a STEPS entry) it belongs to.
    argv: the command line.
    creates: it creates the node. If it fails, the name may be another
      node's, so --delete_after deletes nothing.
  """

  step: str
  argv: tuple[str, ...]
  creates: bool = False


@dataclasses.dataclass(frozen=True)
class Plan:
  header: tuple[str, ...]
  commands: tuple[Command, ...]
  hosts: int


@dataclasses.dataclass(frozen=True)
class _Node:
  """The TPU a launch works on.

  Attributes:
    name: the TPU VM's name, and the queued resource's.
    where: gcloud's --zone and --project flags.
    tpu: the accelerator type, resolved (launch/tpus.py).
    runtime_version: the TPU software version.
  """

  name: str
  where: tuple[str, ...]
  tpu: tpus.Slice
  runtime_version: str


def jax_version():
  """setup.py's jax pin: the workers install jax[tpu] at exactly it."""
  setup = (ROOT / "setup.py").read_text()
  jax_pin = re.search(r"[\"']jax==([^\"']+)[\"']", setup)
  jaxlib_pin = re.search(r"[\"']jaxlib==([^\"']+)[\"']", setup)
  if not jax_pin or not jaxlib_pin or jax_pin[1] != jaxlib_pin[1]:
    raise LaunchError("setup.py must pin jax and jaxlib to the same version")
  return jax_pin[1]


def _check_gin_files(gin_files, repo):
  for gin_file in gin_files:
    if pathlib.PurePath(gin_file).is_absolute():
      raise LaunchError(
          f"gin file {gin_file!r}: give it relative to the repository (the "
          "workers have the repository, not this machine's files)"
      )
    if repo == "local" and not any(
        (base / gin_file).is_file() for base in (ROOT, ROOT / "configs")
    ):
      raise LaunchError(f"gin file {gin_file!r} is not in {ROOT} or configs/")


def _check_flags(name, repo, ref, python, steps):
  if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
    raise LaunchError(
        f"bad TPU name {name!r}: lowercase letters, digits and hyphens, "
        "starting with a letter, at most 63"
    )
  if repo != "local" and not re.fullmatch(r"(https://|git@|ssh://).+", repo):
    raise LaunchError(f"--repo must be 'local' or a git URL, got {repo!r}")
  if not re.fullmatch(r"python[\d.]*", python):
    raise LaunchError(f"--python must be like python3.11, got {python!r}")
  if ref and repo == "local":
    raise LaunchError("--ref needs a git --repo")
  unknown = [s for s in steps if s not in STEPS]
  if unknown or not steps:
    raise LaunchError(
        f"bad --steps {','.join(steps)}: a list of {', '.join(STEPS)}"
    )
  if {"queue", "create"} <= set(steps):
    raise LaunchError(
        "--steps has both queue and create: queue creates the node itself"
    )


def _install(node, repo, ref, python):
  """Python, the repository and a virtualenv on every worker."""
  name = node.name
  planned = []
  setup = [commands.apt_python(python), f"rm -rf ~/{REMOTE_REPO}"]
  if repo == "local":
    tarball = str(pathlib.Path(tempfile.gettempdir()) / f"{name}.tar.gz")
    # Tracked and untracked files, less what .gitignore ignores.
    pack = (
        f"git -C {shlex.quote(str(ROOT))} ls-files -z --cached --others "
        f"--exclude-standard | tar -czf {shlex.quote(tarball)} -C "
        f"{shlex.quote(str(ROOT))} --null -T -"
    )
    planned.append(Command("install", ("bash", "-o", "pipefail", "-c", pack)))
    copy = (*commands.TPU_VM, "scp", tarball, f"{name}:{REMOTE_TARBALL}")
    planned.append(Command("install", (*copy, *node.where, "--worker=all")))
    setup += [
        f"mkdir -p ~/{REMOTE_REPO}",
        f"tar -xzf ~/{REMOTE_TARBALL} -C ~/{REMOTE_REPO}",
    ]
  else:
    setup.append(f"git clone --quiet {shlex.quote(repo)} ~/{REMOTE_REPO}")
    if ref:
      setup.append(
          f"git -C ~/{REMOTE_REPO} checkout --quiet {shlex.quote(ref)}"
      )
  jax_tpu = commands.quote(f"jax[tpu]=={jax_version()}")
  setup += [
      f"{python} -m venv ~/{REMOTE_VENV}",
      f"~/{REMOTE_VENV}/bin/pip install --quiet --upgrade pip",
      f"~/{REMOTE_VENV}/bin/pip install --quiet -e ~/{REMOTE_REPO} {jax_tpu}",
  ]
  ssh = commands.ssh(name, node.where, "all", " && ".join(setup))
  return planned + [Command("install", ssh)]


def _run(node, gin_files, gin_bindings, model_parallel, run_output_dir):
  """spec_decode.run on every worker at once."""
  multi_host = node.tpu.hosts > 1
  run_args = [f"--gin_file={f}" for f in gin_files] + [
      f"--gin_bindings={b}"
      for b in [
          f"make_mesh.model_parallel={model_parallel}",
          f"initialize_distributed.enabled={multi_host}",
          f"run.output_dir='{run_output_dir}'",
          *gin_bindings,
      ]
  ]
  run = (
      f"cd ~/{REMOTE_REPO} && ~/{REMOTE_VENV}/bin/python -m spec_decode.run "
      + commands.join(run_args)
  )
  return [Command("run", commands.ssh(node.name, node.where, "all", run))]


def _fetch(node, output_dir, remote_results):
  """Worker 0's results, to this machine or to gs://."""
  if output_dir.startswith("gs://"):
    copy = (
        f"gcloud storage cp --recursive ~/{remote_results} "
        f"{shlex.quote(output_dir.rstrip('/') + '/')}"
    )
    return [Command("fetch", commands.ssh(node.name, node.where, "0", copy))]
  scp = (*commands.TPU_VM, "scp", "--recurse", f"{node.name}:{remote_results}")
  return [
      Command("fetch", ("mkdir", "-p", output_dir)),
      Command("fetch", (*scp, output_dir, *node.where, "--worker=0")),
  ]


def _node(config, project, zone, name, accelerator_type, runtime_version):
  preset = PRESETS[config]
  try:
    tpu = tpus.resolve(accelerator_type or preset.accelerator_type)
    zone = zone or tpu.generation.zones[0]
    tpus.check_zone(tpu, zone)
  except tpus.TpuError as e:
    raise LaunchError(str(e)) from None
  return _Node(
      name=name or f"spec-decode-{config}",
      where=commands.where(zone, project),
      tpu=tpu,
      runtime_version=runtime_version or tpu.generation.runtime_version,
  )


def plan(
    config,
    *,
    project=None,
    zone=None,
    name=None,
    accelerator_type=None,
    runtime_version=None,
    spot=False,
    gin_files=None,
    gin_bindings=(),
    model_parallel=None,
    output_dir="results/tpu",
    repo="local",
    ref=None,
    python="python3.11",
    steps=("create", "install", "run", "fetch"),
    delete_after=False,
):
  """The commands of a launch, in order.

  Args:
    config: a key of PRESETS.
    project: the Google Cloud project; gcloud's default when None.
    zone: the zone; the accelerator generation's default when None.
    name: the TPU VM's name; spec-decode-<config> when None.
    accelerator_type: any generation's; the preset's when None.
    runtime_version: the TPU software version; the generation's when None.
    spot: create a Spot TPU VM.
    gin_files: the run's gin files; the preset's when None.
    gin_bindings: extra bindings, after the launcher's own.
    model_parallel: make_mesh.model_parallel; all chips when None.
    output_dir: a local directory or gs:// path; results go in
      <output_dir>/<name>.
    repo: 'local' (this working tree) or a git URL.
    ref: with a git repo, what to check out.
    python: the workers' Python.
    steps: which of STEPS to take.
    delete_after: add the delete step.

  Returns:
    A Plan: comment lines that say what runs where, and the commands.

  Raises:
    LaunchError: a bad argument, in one line.
  """
  if config not in PRESETS:
    raise LaunchError(
        f"unknown --config {config!r}: one of {', '.join(PRESETS)}"
    )
  node = _node(config, project, zone, name, accelerator_type, runtime_version)
  _check_flags(node.name, repo, ref, python, steps)
  tpu = node.tpu
  if model_parallel is None:
    model_parallel = tpu.chips
  if model_parallel < 1 or tpu.chips % model_parallel:
    raise LaunchError(
        f"--model_parallel={model_parallel} must divide the {tpu.chips} chips "
        f"of {tpu.accelerator_type}"
    )
  gin_files = list(gin_files or PRESETS[config].gin_files)
  _check_gin_files(gin_files, repo)
  steps = set(steps) | ({"delete"} if delete_after else set())
  to_gcs = output_dir.startswith("gs://")
  if not to_gcs:
    output_dir = os.path.expanduser(output_dir)
  scopes = commands.WRITE_SCOPES if to_gcs else ()
  node_args = (node.name, node.where, tpu, node.runtime_version, spot, scopes)
  run_output_dir = f"results/{node.name}"  # On each worker, in the repo.

  planned = []
  if "queue" in steps:
    planned += [
        Command("queue", commands.queue(*node_args), creates=True),
        Command("queue", commands.wait_active(node.name, node.where)),
    ]
  if "create" in steps:
    planned.append(Command("create", commands.create(*node_args), creates=True))
  if "install" in steps:
    planned += _install(node, repo, ref, python)
  if "run" in steps:
    planned += _run(
        node, gin_files, gin_bindings, model_parallel, run_output_dir
    )
  if "fetch" in steps:
    planned += _fetch(node, output_dir, f"{REMOTE_REPO}/{run_output_dir}")
  if "delete" in steps:
    planned.append(_delete(node, steps))
  results = f"{output_dir.rstrip('/')}/{node.name}"
  header = _header(config, node, project, model_parallel, results)
  return Plan(header, tuple(planned), tpu.hosts)


def _delete(node, steps):
  """The delete step, of whatever the launch's steps made or found."""
  if "queue" in steps:
    queued = True
  elif "create" in steps:
    queued = False
  else:  # A node from an earlier launch: the delete finds out which.
    queued = None
  return Command("delete", commands.delete(node.name, node.where, queued))


def _header(config, node, project, model_parallel, results):
  """The plan's comment lines: the preset, the node, the mesh, the results."""
  tpu = node.tpu
  zone = node.where[0].removeprefix("--zone=")
  return (
      f"# {config}: {PRESETS[config].description}.",
      f"# {node.name}: {tpu.accelerator_type} ({tpu.generation.name}, "
      f"{tpu.hosts} host{'s' if tpu.hosts > 1 else ''}, {tpu.chips} chips), "
      f"{node.runtime_version}, {zone}, project {project or '(gcloud default)'}"
      ".",
      f"# Mesh: model_parallel={model_parallel}, "
      f"data={tpu.chips // model_parallel}; results in {results}/.",
  )


def _describe(step, hosts):
  return {
      "queue": (
          "# queue: a queued resource for the TPU VM, then a wait until it is "
          "ACTIVE (billed from then until deleted)"
      ),
      "create": "# create: the TPU VM (billed from now until deleted)",
      "install": "# install: spec_decode and jax[tpu] on every worker",
      "run": (
          "# run: spec_decode.run on the worker"
          if hosts == 1
          else f"# run: spec_decode.run on all {hosts} workers at once, one "
          "jax.distributed job"
      ),
      "fetch": "# fetch: worker 0's results",
      "delete": "# delete: the TPU VM, or the queued resource and its node",
  }[step]


def _print_plan(launch):
  for line in launch.header:
    print(line)
  step = None
  for command in launch.commands:
    if command.step != step:
      step = command.step
      print(_describe(step, launch.hosts))
    print(commands.join(command.argv))


def _execute(planned, delete_after):
  """Runs the commands in order; a failure deletes the node if asked."""
  if shutil.which("gcloud") is None:
    raise LaunchError(
        "gcloud is not on PATH: install the Google Cloud CLI "
        "(https://cloud.google.com/sdk/docs/install), or pass --dry_run"
    )
  deletes = [c for c in planned if c.step == "delete"]
  for command in planned:
    print(f"+ {commands.join(command.argv)}", file=sys.stderr, flush=True)
    returncode = subprocess.run(command.argv, check=False).returncode
    if returncode:
      if delete_after and not command.creates and command.step != "delete":
        for delete in deletes:
          print(f"+ {commands.join(delete.argv)}", file=sys.stderr, flush=True)
          subprocess.run(delete.argv, check=False)
      raise LaunchError(
          f"{command.step} failed (exit status {returncode}): "
          f"{commands.join(command.argv)}"
      )


def main(argv):
  if len(argv) > 1:
    print(f"error: unexpected arguments: {argv[1:]}", file=sys.stderr)
    sys.exit(1)
  try:
    if _CONFIG.value is None:
      raise LaunchError(f"--config is required: one of {', '.join(PRESETS)}")
    launch = plan(
        _CONFIG.value,
        project=_PROJECT.value,
        zone=_ZONE.value,
        name=_NAME.value,
        accelerator_type=_ACCELERATOR_TYPE.value,
        runtime_version=_RUNTIME_VERSION.value,
        spot=_SPOT.value,
        gin_files=_GIN_FILES.value,
        gin_bindings=_GIN_BINDINGS.value,
        model_parallel=_MODEL_PARALLEL.value,
        output_dir=_OUTPUT_DIR.value,
        repo=_REPO.value,
        ref=_REF.value,
        python=_PYTHON.value,
        steps=_STEPS.value,
        delete_after=_DELETE_AFTER.value,
    )
    if _DRY_RUN.value:
      _print_plan(launch)
      return
    _execute(launch.commands, _DELETE_AFTER.value)
  except (LaunchError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
