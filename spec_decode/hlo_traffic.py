"""Off-chip bytes of a compiled module, counted from its HLO text.

`cost_analysis()` counts every byte each instruction reads and writes, in
whatever memory it lies. A TPU compile prefetches small weights from HBM into
on-chip VMEM (`copy-start` / `copy-done`, their layouts marked `S(1)`), and
the count then holds each such weight about five times: a [8, 4096] x
[4096, 4096] bfloat16 dot counts 168 MB for its 34 MB of operands, the same
dot of one row (no prefetch) 34 MB. HBM gives the weight once.

`offchip_bytes` counts, for each instruction of the entry computation, the
bytes of its operands and results that live in off-chip memory (no memory
space in their layout), once each:

- a `copy-start` counts its source, a `copy-done` nothing: the prefetch
  reads the weight once, and its consumer reads it on chip;
- a slice (`slice`, `dynamic-slice`, `gather`) reads what it returns, not
  its whole operand, and so does a fusion operand that the fused
  computation only slices;
- an in-place update (`dynamic-update-slice`, `scatter`), alone or as a
  fusion's root, writes its update's bytes and reads nothing of the operand
  it updates;
- control flow (`while`, `conditional`, `call`) and instructions that move
  no data (`parameter`, `tuple`, `get-tuple-element`, `bitcast`,
  `constant`) count nothing.

It reads the module as the compiler left it, so it does not see traffic
inside a fusion (a tiled dot that re-reads an operand) or spills; it is an
estimate of what the program's buffers require, to set beside
`cost_analysis()`. On a CPU compile nothing is marked on chip, so every
operand counts.

  moved = hlo_traffic.offchip_bytes(compiled.as_text())
"""

import math
import re

# An HLO instruction: `%name = <result type> opcode(operands), attributes`.
_INSTRUCTION = re.compile(
    r"^\s*(?P<root>ROOT )?%?(?P<name>[\w.\-]+) = (?P<type>.*?) "
    r"(?P<op>[a-z][\w\-]*)\((?P<rest>.*)$"
)
# A computation's header: `%name (params) -> type {`, or `ENTRY %name ...`.
_COMPUTATION = re.compile(
    r"^(?P<entry>ENTRY )?%?(?P<name>[\w.\-]+) \(.*\) -> .*\{$"
)
# An array type in a result or operand: `bf16[8,4096]{1,0:T(8,128)S(1)}`.
_ARRAY = re.compile(
    r"\b(?P<dtype>pred|[suf]\d+|bf16)\[(?P<dims>[\d,]*)\](?P<layout>\{[^}]*\})?"
)
# A layout's memory space other than the default (off-chip) one.
_ON_CHIP = re.compile(r"S\(\d+\)")
_ITEMSIZE = {"pred": 1, "bf16": 2}
# Instructions counted as nothing: control flow (its bodies are other
# computations), the end of a prefetch (its start counts), and those that
# move no data.
_UNCOUNTED = (
    "while",
    "conditional",
    "call",
    "copy-done",
    "after-all",
    "parameter",
    "constant",
    "tuple",
    "get-tuple-element",
    "bitcast",
)
_SLICES = ("slice", "dynamic-slice", "gather")
# In-place updates and the position of their update operand.
_UPDATES = {"dynamic-update-slice": 1, "scatter": 2}


def _itemsize(dtype):
  return _ITEMSIZE.get(dtype) or int(dtype[1:]) // 8


def array_bytes(hlo_type, offchip_only=True):
  """Bytes of the arrays in an HLO type (a tuple's summed).

  Args:
    hlo_type: e.g. 'bf16[8,4096]{1,0}' or '(f32[8]{0}, u32[])'.
    offchip_only: skip arrays whose layout names an on-chip memory space.
  """
  total = 0
  for array in _ARRAY.finditer(hlo_type):
    if offchip_only and _ON_CHIP.search(array["layout"] or ""):
      continue
    dims = [int(d) for d in array["dims"].split(",") if d]
    total += math.prod(dims) * _itemsize(array["dtype"])
  return total


def _parse(hlo_text):
  """{computation name: [instruction dicts]}, the entry's under 'ENTRY'."""
  computations, current = {}, None
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header:
      current = computations.setdefault(
          "ENTRY" if header["entry"] else header["name"], []
      )
      continue
    match = _INSTRUCTION.match(line)
    if match and current is not None:
      operands = match["rest"].split(")")[0]
      current.append(
          dict(
              match.groupdict(),
              operands=re.findall(r"%([\w.\-]+)", operands),
              calls=(
                  re.findall(r"calls=%?([\w.\-]+)", match["rest"]) or [None]
              )[0],
              parameter=re.match(r"(\d+)\)", match["rest"]),
          )
      )
  return computations


def _fused_reads(fused, index, full):
  """Bytes a fused computation reads of its operand `index` (`full` bytes)."""
  names = [
      i["name"]
      for i in fused
      if i["op"] == "parameter" and int(i["parameter"][1]) == index
  ]
  users = [i for i in fused if names and names[0] in i["operands"]]
  if users and all(
      u["op"] in _SLICES and u["operands"][0] == names[0] for u in users
  ):
    return sum(array_bytes(u["type"], offchip_only=False) for u in users)
  if users and all(
      u["op"] in _UPDATES and u["operands"][0] == names[0] for u in users
  ):
    return 0
  return full


def _fused_writes(fused, full):
  """Bytes a fusion writes: its update if its root updates in place."""
  root = next((i for i in fused if i["root"]), None)
  if root is None or root["op"] not in _UPDATES:
    return full
  types = {i["name"]: i["type"] for i in fused}
  update = root["operands"][_UPDATES[root["op"]]]
  return array_bytes(types.get(update, ""), offchip_only=False)


def instruction_bytes(hlo_text):
  """[(off-chip bytes, opcode, name)] for the entry's instructions."""
  computations = _parse(hlo_text)
  entry = computations.get("ENTRY", [])
  types = {i["name"]: i["type"] for i in entry}
  counted = []
  for inst in entry:
    op = inst["op"]
    if op in _UNCOUNTED:
      continue
    operands = [array_bytes(types.get(o, "")) for o in inst["operands"]]
    writes = 0 if op == "copy-start" else array_bytes(inst["type"])
    if op in _SLICES:
      operands[0] = writes
    elif op in _UPDATES:
      operands[0] = 0
      writes = array_bytes(types.get(inst["operands"][_UPDATES[op]], ""))
    elif op == "fusion" and inst["calls"] in computations:
      fused = computations[inst["calls"]]
      operands = [
          _fused_reads(fused, index, full) if full else 0
          for index, full in enumerate(operands)
      ]
      writes = _fused_writes(fused, writes) if writes else 0
    counted.append((sum(operands) + writes, op, inst["name"]))
  return counted


def offchip_bytes(hlo_text):
  """The entry computation's off-chip bytes read and written (see above)."""
  return sum(count for count, _, _ in instruction_bytes(hlo_text))
