"""The collectives of an optimised HLO module: kind, replica groups, bytes, loop trips.

Bytes on the wire follow ring algorithms: an all-gather or reduce-scatter of S bytes over
g devices moves S (g - 1) / g per device, an all-reduce twice that; a collective inside a
while loop's body counts once per iteration. Time is bytes over the link's bandwidth:
NVLink within a domain, the network beyond.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
import numpy as np
from rlcode.plan import hardware


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


_SHAPE = re.compile(r"\b(pred|[sufc]\d+|bf16)\[([\d,]*)\]")


_OP = re.compile(r"=\s*(.*?)\s(" + "|".join(COLLECTIVES) + r")(-start)?\(")


_HEADER = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")


def _bytes(type_text: str) -> int:
  return sum(_DTYPE_BYTES[t] * math.prod(int(x) for x in dims.split(",") if x)
             for t, dims in _SHAPE.findall(type_text))


def _groups(line: str, num_devices: int) -> list[list[int]]:
  """The replica groups of a collective, in the three textual forms XLA prints."""
  explicit = re.search(r"replica_groups=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}", line)
  if explicit:
    return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}",
                                                                    explicit.group(1))]
  iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
  if iota:
    n, g = int(iota.group(1)), int(iota.group(2))
    dims = [int(x) for x in iota.group(3).split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if iota.group(4):
      ids = ids.transpose([int(x) for x in iota.group(4).split(",")])
    return ids.reshape(n, g).tolist()
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(\[([\d,]+)\]"
                   r"(?:T\(([\d,]+)\))?\))?\s*\{([^}]*)\}", line)
  if mesh:
    names = re.findall(r"'([^']+)'=(\d+)", mesh.group(1))
    over = re.findall(r"'([^']+)'", mesh.group(4))
    shape = [int(s) for _, s in names]
    order = [i for i, (a, _) in enumerate(names) if a not in over] + [
        [a for a, _ in names].index(a) for a in over]
    # device_ids, when printed, numbers the mesh's positions: an iota of its own shape,
    # maybe transposed, then laid out in the mesh's shape.
    ids = np.arange(math.prod(shape))
    if mesh.group(2):
      ids = ids.reshape([int(x) for x in mesh.group(2).split(",")])
      if mesh.group(3):
        ids = ids.transpose([int(x) for x in mesh.group(3).split(",")])
    ids = ids.reshape(shape).transpose(order)
    size = math.prod(shape[[a for a, _ in names].index(a)] for a in over)
    return ids.reshape(-1, size).tolist()
  pairs = re.search(r"source_target_pairs=\{(.*?)\}\}?", line)
  if pairs:
    return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs.group(0))]
  return [list(range(num_devices))]


def collectives(hlo: str, num_devices: int, unknown_trips: int = 1) -> list[dict]:
  """The collectives of an optimised HLO module: kind, bytes (of the result), group size,
  the groups, and how many times each runs (a while body's count times its trip
  count, `unknown_trips` where XLA could not tell it)."""
  computations: dict[str, list[str]] = {}
  entry, current = None, None
  for line in hlo.splitlines():
    header = _HEADER.match(line)
    if header:
      current = header.group(1)
      computations[current] = []
      if line.lstrip().startswith("ENTRY"):
        entry = current
    elif current is not None and line.strip() and line.strip() != "}":
      computations[current].append(line)
  times = {name: 0 for name in computations}
  times[entry] = 1
  # Callers are printed after their callees: walk from the entry down, repeatedly.
  for _ in range(len(computations)):
    new = {name: 0 for name in computations}
    new[entry] = 1
    for name, lines in computations.items():
      for line in lines:
        body = re.search(r"body=%?([\w.\-]+)", line)
        if body and " while(" in line:
          trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
          count = int(trips.group(1)) if trips else unknown_trips
          new[body.group(1)] = new.get(body.group(1), 0) + times[name] * count
          continue
        for callee in re.findall(r"(?:calls|to_apply|true_computation|false_computation)="
                                 r"%?([\w.\-]+)", line):
          new[callee] = new.get(callee, 0) + times[name]
        branches = re.search(r"branch_computations=\{([^}]*)\}", line)
        if branches:
          for callee in re.findall(r"%?([\w.\-]+)", branches.group(1)):
            new[callee] = new.get(callee, 0) + times[name]
    if new == times:
      break
    times = new
  out = []
  for name, lines in computations.items():
    for line in lines:
      op = _OP.search(line)
      if not op or times.get(name, 0) == 0:
        continue
      groups = _groups(line, num_devices)
      out.append({"kind": op.group(2), "bytes": _bytes(op.group(1)),
                  "group": len(groups[0]), "groups": groups, "times": times[name]})
  return out


def wire_bytes(c: Mapping) -> float:
  """Bytes one device sends for a collective, ring algorithms."""
  g, size = c["group"], c["bytes"]
  if g <= 1:
    return 0.0
  return {"all-gather": size * (g - 1) / g, "reduce-scatter": size * (g - 1),
          "all-reduce": 2 * size * (g - 1) / g, "all-to-all": size * (g - 1) / g,
          "collective-permute": size}[c["kind"]]


def collective_seconds(cs: Sequence[Mapping], hw: hardware.Hardware) -> float:
  total = 0.0
  for c in cs:
    crosses = any(len({d // hw.domain for d in g}) > 1 for g in c["groups"])
    bandwidth = hw.network_bytes_per_s if crosses else hw.link_bytes_per_s
    total += wire_bytes(c) * c["times"] / bandwidth
  return total


def summarise_collectives(cs: Sequence[Mapping]) -> dict[str, dict]:
  out: dict[str, dict] = {}
  for c in cs:
    s = out.setdefault(c["kind"], {"count": 0, "bytes": 0.0, "wire_bytes": 0.0})
    s["count"] += c["times"]
    s["bytes"] += c["bytes"] * c["times"]
    s["wire_bytes"] += wire_bytes(c) * c["times"]
  return out
