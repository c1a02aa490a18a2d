"""The machine a measurement ran on, recorded beside its numbers.

A speedup is a property of a pair and a machine together: the same demo pair
ran at 1.41-1.46x on one 2-core AMD EPYC with a 32 MiB L3 cache and at 0.91x
on another with 16 MiB, where a 5-token target call cost 3.0 one-token calls
instead of 1.3-1.7 (see the README's "The memory-bound demo target"). So
every results.json says where it was measured.
"""

import os
import pathlib
import platform

import jax

# Linux's descriptions of the CPU and of its caches.
_CPUINFO = pathlib.Path("/proc/cpuinfo")
_CACHES = pathlib.Path("/sys/devices/system/cpu/cpu0/cache")


def _cpuinfo_field(name, cpuinfo):
  """The first value of `name` in cpuinfo, or None."""
  try:
    for line in cpuinfo.read_text().splitlines():
      key, _, value = line.partition(":")
      if key.strip() == name and value.strip():
        return value.strip()
  except OSError:
    pass
  return None


def cpu_model(cpuinfo=_CPUINFO):
  """The CPU's model name ('AMD EPYC'), or platform.processor()'s guess."""
  return (
      _cpuinfo_field("model name", cpuinfo)
      or platform.processor()
      or platform.machine()
      or "unknown"
  )


def cpu_family(cpuinfo=_CPUINFO):
  """'family 26 model 2', or None where Linux does not say.

  A cloud VM's model name is often only 'AMD EPYC': the family and model
  tell its generations apart (AMD's family 23 is Zen 2, 25 Zen 3 and 4, 26
  Zen 5).
  """
  family = _cpuinfo_field("cpu family", cpuinfo)
  model = _cpuinfo_field("model", cpuinfo)
  if family is None or model is None:
    return None
  return f"family {family} model {model}"


def last_level_cache(caches=_CACHES):
  """The size of cpu0's highest-level cache as Linux writes it ('16384K').

  Returns:
    (level, size), e.g. (3, '16384K'); None where Linux does not say.
  """
  best = None
  try:
    for index in sorted(caches.glob("index*")):
      level = int((index / "level").read_text())
      size = (index / "size").read_text().strip()
      if best is None or level > best[0]:
        best = (level, size)
  except (OSError, ValueError):
    return None
  return best


def describe():
  """The host and the accelerator, as a JSON-ready dict.

  Returns:
    {'platform': jax's backend ('cpu', 'gpu', 'tpu'), 'device_kind',
    'num_devices', 'num_processes', 'cpu': the host CPU's model,
    'cpu_family': `cpu_family()` (or None), 'cpus':
    logical CPUs this process may use, 'last_level_cache': e.g. 'L3
    16384K' or None, 'jax': its version}.
  """
  device = jax.devices()[0]
  cache = last_level_cache()
  try:
    cpus = len(os.sched_getaffinity(0))
  except AttributeError:  # Not on Linux.
    cpus = os.cpu_count()
  return {
      "platform": device.platform,
      "device_kind": device.device_kind,
      "num_devices": jax.device_count(),
      "num_processes": jax.process_count(),
      "cpu": cpu_model(),
      "cpu_family": cpu_family(),
      "cpus": cpus,
      "last_level_cache": None if cache is None else f"L{cache[0]} {cache[1]}",
      "jax": jax.__version__,
  }


def summary(machine):
  """describe()'s dict on one line: 'cpu: AMD EPYC, 2 CPUs, L3 16384K'.

  With a CPU family: 'cpu: AMD EPYC (family 26 model 2), 2 CPUs, ...'.
  """
  host = machine["cpu"]
  if machine.get("cpu_family"):
    host += f" ({machine['cpu_family']})"
  host += f", {machine['cpus']} CPUs"
  if machine.get("last_level_cache"):
    host += f", {machine['last_level_cache']}"
  if machine["platform"] == "cpu":
    return f"cpu: {host}"
  return (
      f"{machine['num_devices']} x {machine['device_kind']} "
      f"({machine['platform']}); host {host}"
  )
