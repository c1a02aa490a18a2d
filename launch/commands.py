"""The gcloud and shell command lines of a launch, as argv tuples.

Flags as the gcloud reference gives them
(https://cloud.google.com/sdk/gcloud/reference/compute/tpus): `tpu-vm create`
takes `--version`, `queued-resources create` takes `--runtime-version` and
`--node-id`, and `queued-resources delete --force` deletes the queued
resource's node first. A queued resource's state is `state.state` in
`describe` (https://cloud.google.com/tpu/docs/queued-resources).
"""

import re
import shlex

TPU_VM = ("gcloud", "compute", "tpus", "tpu-vm")
QUEUED = ("gcloud", "compute", "tpus", "queued-resources")
# What a TPU VM needs to write to Cloud Storage: Google's recommended scope,
# with access then limited by the service account's IAM roles.
WRITE_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
# apt on a freshly booted VM: the image's own apt runs (unattended-upgrades)
# hold dpkg's lock for minutes. Each apt-get waits up to this long for it...
APT_LOCK_TIMEOUT_S = 600
# ... and `apt-get update` is tried this many times, this far apart, for the
# lists lock.
APT_UPDATE_TRIES = 30
APT_UPDATE_WAIT_S = 10
# Seconds between two looks at a queued resource's state.
QUEUE_POLL_S = 60


def quote(arg):
  """Quotes for a POSIX shell, preferring double quotes for readability.

  Args:
    arg: one argument.

  Returns:
    `arg` as it reads back from `shlex.split` and from bash alike.
  """
  if re.fullmatch(r"[\w@%+=:,./-]+", arg):
    return arg
  if re.search(r"[$`!]", arg):  # Special inside double quotes.
    return shlex.quote(arg)
  return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def join(argv):
  """A command line: `--flag=value` quotes only the value."""
  words = []
  for arg in argv:
    match = re.fullmatch(r"(--[\w-]+=)(.*)", arg, re.DOTALL)
    words.append(match[1] + quote(match[2]) if match else quote(arg))
  return " ".join(words)


def where(zone, project):
  """The zone and project flags every gcloud command of a launch takes."""
  return (f"--zone={zone}",) + ((f"--project={project}",) if project else ())


def ssh(name, zone_project, worker, command):
  return (
      *TPU_VM,
      "ssh",
      name,
      *zone_project,
      f"--worker={worker}",
      f"--command={command}",
  )


def _node_flags(tpu, runtime_flag, runtime_version, spot, scopes):
  return (
      f"--accelerator-type={tpu.accelerator_type}",
      f"{runtime_flag}={runtime_version}",
      *(("--spot",) if spot else ()),
      *((f"--scopes={','.join(scopes)}",) if scopes else ()),
  )


def create(name, zone_project, tpu, runtime_version, spot, scopes):
  """`tpu-vm create`: the TPU VM, now or never."""
  flags = _node_flags(tpu, "--version", runtime_version, spot, scopes)
  return (*TPU_VM, "create", name, *zone_project, *flags)


def queue(name, zone_project, tpu, runtime_version, spot, scopes):
  """`queued-resources create`: the node `name`, once capacity frees up."""
  flags = _node_flags(tpu, "--runtime-version", runtime_version, spot, scopes)
  return (
      *QUEUED,
      "create",
      name,
      f"--node-id={name}",
      *zone_project,
      *flags,
  )


def wait_active(name, zone_project):
  """Waits until the queued resource is ACTIVE; fails if it cannot be."""
  describe = join(
      (*QUEUED, "describe", name, *zone_project, "--format=value(state.state)")
  )
  script = (
      f'while state=$({describe}); do echo "queued resource {name}: '
      '$state" >&2; case $state in ACTIVE) exit 0;; '
      "FAILED|SUSPENDING|SUSPENDED|DELETING) exit 1;; esac; "
      f"sleep {QUEUE_POLL_S}; done; exit 1"
  )
  return ("bash", "-c", script)


def delete(name, zone_project, queued):
  """Deletes the node; `queued`: True, False or None (find out which)."""
  vm = (*TPU_VM, "delete", name, *zone_project, "--quiet")
  qr = (*QUEUED, "delete", name, *zone_project, "--force", "--quiet")
  if queued is None:
    probe = (*QUEUED, "describe", name, *zone_project)
    script = (
        f"if {join(probe)} >/dev/null 2>&1; then {join(qr)}; else "
        f"{join(vm)}; fi"
    )
    return ("bash", "-c", script)
  return qr if queued else vm


def apt_python(python):
  """Shell: install `python` and its venv module with apt, if missing."""
  apt_get = f"apt-get -o DPkg::Lock::Timeout={APT_LOCK_TIMEOUT_S}"
  return (
      f'{{ {python} -c "import ensurepip" 2>/dev/null || {{ try=1; until '
      f"sudo {apt_get} update -qq; do [ $try -ge {APT_UPDATE_TRIES} ] && "
      f"exit 1; try=$((try+1)); sleep {APT_UPDATE_WAIT_S}; done && sudo "
      f"DEBIAN_FRONTEND=noninteractive {apt_get} install -y -qq {python} "
      f"{python}-venv; }}; }}"
  )
