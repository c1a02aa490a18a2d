r"""Mutation check: each core claim is caught by the test file that owns it.

Each mutation is a plausible bug, applied to a temporary copy of this
checkout by a regular expression that must match exactly once (else the run
stops with "pattern not found": a mutation that silently does not apply
would count as caught by nothing). The owning test file then runs on the
mutated copy (only the tests in it that own the claim, a -k selection,
unless --whole_files; the whole files take an hour on two shared cores); the
mutation is caught when a test fails (pytest exit status 1). A collection error or a timeout counts as not caught. First, each owning
file runs once on the unmutated copy (the control), which must pass.

Prints a table (mutation, owning file, caught, seconds, the first failing
test) and writes it as JSON.

Usage:
  nice python benchmarks/mutations.py
  python benchmarks/mutations.py --only=bonus_from_residual --nocontrol
"""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

_ONLY = flags.DEFINE_list("only", [], "Run only these mutations (names).")
_CONTROL = flags.DEFINE_bool(
    "control", True, "First run each owning file on the unmutated copy."
)
_OUTPUT = flags.DEFINE_string(
    "output",
    os.path.join(os.path.dirname(__file__), "results", "mutations.json"),
    "Where to write the table as JSON.",
)
_WHOLE_FILES = flags.DEFINE_bool(
    "whole_files",
    False,
    "Run each owning file whole, not only the tests that own the claim.",
)
_TIMEOUT = flags.DEFINE_integer(
    "timeout", 1800, "Seconds allowed for one run of a test file."
)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Not copied: version control, environments, caches.
_IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.pyc", ".pytest_cache"
)


@dataclasses.dataclass(frozen=True)
class Mutation:
  """A bug, where it goes, and the test file that owns the claim it breaks.

  Attributes:
    name: a short id.
    bug: what the mutation does, in words.
    path: the mutated file, relative to the checkout.
    pattern: a regular expression that matches exactly once in `path`.
    replacement: what replaces the match (re.sub syntax).
    test: the owning test file, relative to the checkout.
    select: a pytest -k expression: the tests of the file that own the
      claim (the whole file with --whole_files).
  """

  name: str
  bug: str
  path: str
  pattern: str
  replacement: str
  test: str
  select: str = ""


MUTATIONS = (
    # The five bugs of issue 19, each caught only by a distant file before.
    Mutation(
        "bonus_from_residual",
        "bonus token from norm(max(0, p_{gamma+1} - q_gamma)), not p_{gamma+1}",
        "spec_decode/verify.py",
        r"(jnp\.pad\(\s*draft_probs,\s*\(\(0, 0\), \(0, 1\), \(0, 0\)\))",
        r'\1, mode="edge"',
        "tests/token_kernel_test.py",
        "BlockLaw",
    ),
    Mutation(
        "bonus_from_residual_target_as_draft",
        "the same bug, against lossless_test's target-as-draft cases alone",
        "spec_decode/verify.py",
        r"(jnp\.pad\(\s*draft_probs,\s*\(\(0, 0\), \(0, 1\), \(0, 0\)\))",
        r'\1, mode="edge"',
        "tests/lossless_test.py",
        "SeveralIterations",
    ),
    Mutation(
        "relative_position_sign",
        "relative position query - key instead of key - query",
        "spec_decode/models/layers.py",
        r"relative = key_positions\[None, None, :\] - "
        r"query_positions\[:, :, None\]",
        "relative = query_positions[:, :, None] - key_positions[None, None, :]",
        "tests/layers_test.py",
        "RelativePositionBias",
    ),
    Mutation(
        "draft_catch_up_not_advanced",
        "draft cache left at len - 1 after the 2-token catch-up",
        "spec_decode/draft_loop.py",
        r"draft_cache\.replace\(lengths=lengths \+ 1\)",
        "draft_cache.replace(lengths=start)",
        "tests/draft_loop_test.py",
        "DraftCatchUp",
    ),
    Mutation(
        "key_folded_with_process",
        "the sampling key folded with jax.process_index()",
        "spec_decode/engine.py",
        r"jax\.random\.key_data\(rng\)",
        "jax.random.key_data(jax.random.fold_in(rng, jax.process_index()))",
        "tests/partitioning_test.py",
        "KeyTest",
    ),
    Mutation(
        "checkpoint_read_whole",
        "a T5X msgpack file read whole into memory before decoding",
        "spec_decode/checkpoints/msgpack_tree.py",
        r"msgpack\.Unpacker\(\s*fp,",
        "msgpack.Unpacker(__import__('io').BytesIO(fp.read()),",
        "tests/checkpoints_test.py",
        "HostMemory",
    ),
    # More, of our choosing.
    Mutation(
        "residual_is_target",
        "after a rejection, the next token drawn from p, not max(0, p - q)",
        "spec_decode/verify.py",
        r"residual = jnp\.maximum\(target_probs - draft_probs, 0\.0\)",
        "residual = target_probs + 0.0 * draft_probs",
        "tests/token_kernel_test.py",
        "TokenKernel or BlockLaw",
    ),
    Mutation(
        "accepted_not_a_prefix",
        "every accepted draft counted, not the leading run",
        "spec_decode/verify.py",
        r"jnp\.sum\(jnp\.cumprod\(accepted, axis=-1\), axis=-1\)",
        "jnp.sum(accepted, axis=-1)",
        "tests/token_kernel_test.py",
        "BlockLaw",
    ),
    Mutation(
        "cache_writes_clipped",
        "KV writes past the capacity clipped onto the last position",
        "spec_decode/models/decode_cache.py",
        r'jnp\.transpose\(keys, \(0, 3, 1, 2\)\), mode="drop"',
        'jnp.transpose(keys, (0, 3, 1, 2)), mode="clip"',
        "tests/decode_cache_test.py",
        "matches_a_loop",
    ),
    Mutation(
        "rms_norm_centered",
        "RMS norm divides by the variance around the mean",
        "spec_decode/models/layers.py",
        r"variance = jnp\.mean\(jnp\.square\(x\), axis=-1, keepdims=True\)",
        "variance = jnp.var(x, axis=-1, keepdims=True)",
        "tests/layers_test.py",
        "RmsNorm",
    ),
    Mutation(
        "ngram_smoothed",
        "n-gram counts add-0.01 smoothed: unseen tokens get drafted",
        "spec_decode/drafts.py",
        r"np\.log\(counts / counts\.sum\(axis=-1, keepdims=True\)\)",
        "np.log((counts + 0.01) / (counts + 0.01).sum(axis=-1, keepdims=True))",
        "tests/drafts_test.py",
        "DraftsInspected",
    ),
    Mutation(
        "block_stop_is_weight",
        "block verification stops with probability w_i, not r_i / (r_i + 1 - w_i)",
        "spec_decode/verify.py",
        r"residual_mass / jnp\.where\(denominator > 0, denominator, 1\.0\)",
        "weights + 0.0 * residual_mass",
        "tests/block_kernel_test.py",
        "law_of_the_emitted_tokens",
    ),
    Mutation(
        "config_leaves_swapped",
        "a traced sampling config gets its temperature and top_p swapped",
        "spec_decode/sampling.py",
        r'zip\(\("temperature", "top_p"\), leaves\)',
        'zip(("top_p", "temperature"), leaves)',
        "tests/sampling_test.py",
        "SamplingConfig",
    ),
    Mutation(
        "pool_returns_before_its_workers",
        "the kernel's pool returns without waiting for the workers that joined",
        "spec_decode/kernels/spin_pool.h",
        r"while \(\(ticket_\.load\(std::memory_order_acquire\) & kJoined\) != 0\)",
        "if (false)",
        "tests/spin_pool_test.py",
        "every_piece_once",
    ),
)


def _copy_checkout(parent: str) -> str:
  """Copies this checkout under `parent`, with ../shared beside it."""
  copy = os.path.join(parent, "repo")
  shutil.copytree(_ROOT, copy, ignore=_IGNORED, symlinks=True)
  shared = os.path.join(os.path.dirname(_ROOT), "shared")
  if os.path.isdir(shared):
    os.symlink(shared, os.path.join(parent, "shared"))
  return copy


def apply(mutation: Mutation, copy: str) -> None:
  """Applies `mutation` to the checkout at `copy`.

  Raises:
    ValueError: if the pattern does not match exactly once.
  """
  path = os.path.join(copy, mutation.path)
  with open(path) as f:
    source = f.read()
  mutated, count = re.subn(mutation.pattern, mutation.replacement, source)
  if count != 1:
    found = "pattern not found" if count == 0 else f"{count} matches"
    raise ValueError(
        f"{mutation.name}: {found} in {mutation.path}: {mutation.pattern!r}"
    )
  with open(path, "w") as f:
    f.write(mutated)


def run_tests(copy: str, test: str, select: str) -> dict:
  """Runs one test file in `copy`; returns its status, time, first failure."""
  command = [sys.executable, "-m", "pytest", "-q", "-x", "-rf", test]
  if select and not _WHOLE_FILES.value:
    command += ["-k", select]
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  start = time.perf_counter()
  try:
    process = subprocess.run(
        command,
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT.value,
    )
    status, output = process.returncode, process.stdout + process.stderr
  except subprocess.TimeoutExpired:
    status, output = "timeout", ""
  failures = re.findall(r"^FAILED (\S+)", output, re.MULTILINE)
  return dict(
      status=status,
      seconds=round(time.perf_counter() - start, 1),
      first_failure=failures[0] if failures else "",
      tail="" if status in (0, 1) else output[-2000:],
  )


def _print_table(rows):
  header = ("mutation", "owning file", "caught", "seconds", "first failure")
  lines = [header] + [
      (
          row["mutation"],
          row["test"] + (f" -k {row['select']}" if row["select"] else ""),
          "yes" if row["caught"] else "NO",
          f"{row['seconds']:.0f}",
          row["first_failure"].split("::", 1)[-1],
      )
      for row in rows
  ]
  widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
  for line in lines:
    print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)))


def main(argv):
  del argv
  unknown = set(_ONLY.value) - {m.name for m in MUTATIONS}
  if unknown:
    raise app.UsageError(f"Unknown mutations: {sorted(unknown)}")
  chosen = [m for m in MUTATIONS if not _ONLY.value or m.name in _ONLY.value]
  parent = tempfile.mkdtemp(prefix="mutations_")
  try:
    copy = _copy_checkout(parent)
    for mutation in chosen:  # Every pattern is checked before any run.
      source = os.path.join(copy, mutation.path)
      shutil.copy(source, source + ".orig")
      apply(mutation, copy)
      shutil.move(source + ".orig", source)
    controls = {}
    if _CONTROL.value:
      for key in dict.fromkeys((m.test, m.select) for m in chosen):
        controls[key] = run_tests(copy, *key)
        print(f"control {' -k '.join(filter(None, key))}: {controls[key]}")
        if controls[key]["status"] != 0:
          raise RuntimeError(f"The control run of {key} fails: {controls}")
    rows = []
    for mutation in chosen:
      source = os.path.join(copy, mutation.path)
      shutil.copy(source, source + ".orig")
      try:
        apply(mutation, copy)
        result = run_tests(copy, mutation.test, mutation.select)
      finally:
        shutil.move(source + ".orig", source)
      rows.append(
          dict(
              mutation=mutation.name,
              bug=mutation.bug,
              test=mutation.test,
              select=mutation.select,
              caught=result["status"] == 1,
              **result,
          )
      )
      print(f"{mutation.name}: {result}", flush=True)
  finally:
    shutil.rmtree(parent)
  _print_table(rows)
  os.makedirs(os.path.dirname(_OUTPUT.value), exist_ok=True)
  with open(_OUTPUT.value, "w") as f:
    json.dump(
        dict(
            mutations=rows,
            controls=[
                dict(test=test, select=select, **result)
                for (test, select), result in controls.items()
            ],
        ),
        f,
        indent=2,
    )
  print(f"Wrote {_OUTPUT.value}")
  if not all(row["caught"] for row in rows):
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
