"""Cloud TPU generations: software version, zones and topology, in one table.

The facts come from the Cloud TPU documentation, read for this table:
- TPU software versions for JAX, https://cloud.google.com/tpu/docs/runtimes
  (v6e: v2-alpha-tpuv6e; v5p: v2-alpha-tpuv5; v5e: v2-alpha-tpuv5-lite; v4
  and older: tpu-ubuntu2204-base);
- zones, https://cloud.google.com/tpu/docs/regions-zones (the zones listed
  there for all configurations of a generation; single-tenant-only zones and
  AI zones are left out). A zone missing here is refused before any gcloud
  call: if the page lists it, add it to ZONES below.
"""

import dataclasses
import re

RUNTIMES_URL = "https://cloud.google.com/tpu/docs/runtimes"
ZONES_URL = "https://cloud.google.com/tpu/docs/regions-zones"


@dataclasses.dataclass(frozen=True)
class Generation:
  """One TPU generation.

  Attributes:
    name: what the Cloud TPU docs call it (v5e is 'v5litepod' in accelerator
      types).
    runtime_version: the TPU software version for JAX.
    cores_per_chip: the number in an accelerator type counts TensorCores; a
      chip is one JAX device.
    zones: the zones that offer it, in the docs' order; the first is the
      default.
  """

  name: str
  runtime_version: str
  cores_per_chip: int
  zones: tuple[str, ...]


# Accelerator-type prefix -> generation. In v4-N and v5p-N, N counts
# TensorCores (2 a chip); in v5litepod-N and v6e-N it counts chips.
GENERATIONS = {
    "v4": Generation("v4", "tpu-ubuntu2204-base", 2, ("us-central2-b",)),
    "v5p": Generation(
        "v5p", "v2-alpha-tpuv5", 2, ("us-central1-a", "us-east5-a")
    ),
    "v5litepod": Generation(
        "v5e",
        "v2-alpha-tpuv5-lite",
        1,
        ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
    ),
    "v6e": Generation(
        "v6e",
        "v2-alpha-tpuv6e",
        1,
        (
            "us-central1-b",
            "us-east1-d",
            "us-east5-a",
            "us-east5-b",
            "europe-west4-a",
        ),
    ),
}


class TpuError(ValueError):
  """An accelerator type or zone that Cloud TPU does not offer."""


@dataclasses.dataclass(frozen=True)
class Slice:
  """An accelerator type, resolved.

  Attributes:
    accelerator_type: e.g. 'v5litepod-8'.
    generation: its row of GENERATIONS.
    hosts: TPU VM workers.
    chips: JAX devices.
  """

  accelerator_type: str
  generation: Generation
  hosts: int
  chips: int


def resolve(accelerator_type):
  """The generation, hosts and chips of an accelerator type.

  Args:
    accelerator_type: e.g. 'v4-8', 'v5litepod-16'.

  Returns:
    A Slice.

  Raises:
    TpuError: an unknown generation or a count it cannot have.
  """
  prefixes = "|".join(GENERATIONS)
  match = re.fullmatch(rf"({prefixes})-(\d+)", accelerator_type)
  if not match:
    raise TpuError(
        f"unknown accelerator type {accelerator_type!r}: expected "
        f"{prefixes}-<count>, e.g. v4-8 or v5litepod-8 (v5e)"
    )
  generation = GENERATIONS[match[1]]
  count = int(match[2])
  if count < 1 or count % generation.cores_per_chip:
    raise TpuError(f"bad accelerator type {accelerator_type!r}")
  chips = count // generation.cores_per_chip
  if generation.cores_per_chip == 2:  # v4, v5p: 4 chips a host.
    hosts = max(1, chips // 4)
  else:  # v5e, v6e: up to 8 chips on one host, 4 a host beyond.
    hosts = 1 if chips <= 8 else chips // 4
  return Slice(accelerator_type, generation, hosts=hosts, chips=chips)


def check_zone(tpu, zone):
  """Refuses a zone that does not offer the slice's generation.

  Args:
    tpu: a Slice.
    zone: e.g. 'us-central2-b'.

  Raises:
    TpuError: the zone is not in the generation's row of GENERATIONS.
  """
  zones = tpu.generation.zones
  if zone not in zones:
    raise TpuError(
        f"zone {zone!r} does not offer {tpu.generation.name} "
        f"({tpu.accelerator_type}): use one of {', '.join(zones)} (from "
        f"{ZONES_URL}; add a zone that page lists to launch/tpus.py)"
    )
