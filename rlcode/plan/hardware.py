"""The hardware `rlcode plan` estimates for: GPUs by their published peaks, and systems.

Published figures per GPU (dense: NVIDIA's Tensor Core figures with sparsity, halved):

| GPU   | bf16 dense FLOP/s | HBM        | HBM bytes/s | NVLink, one direction | source |
|-------|-------------------|------------|-------------|-----------------------|--------|
| h200  | 989e12            | 141 GB     | 4.8e12      | 450e9 (900 GB/s both) | NVIDIA H200 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/h200 (BF16 1,979 TFLOPS with sparsity; 141 GB HBM3e at 4.8 TB/s; NVLink 900 GB/s) |
| gb200 | 2.5e15            | 186 GB     | 8.0e12      | 900e9 (1.8 TB/s both) | NVIDIA GB200 NVL72 product page, nvidia.com/en-us/data-center/gb200-nvl72 (rack of 72 GPUs: BF16 360 PFLOPS with sparsity, up to 13.4 TB HBM3e at 576 TB/s, NVLink 130 TB/s), divided by 72 |

Systems: h200x8 is one HGX H200 board (8 GPUs in one NVLink domain); gb200-nvl72 is
one rack (72 GPUs in one NVLink domain). Beyond a domain, each GPU's network link is
taken as 50 GB/s per direction (one 400 Gb/s ConnectX-7 NIC per GPU).
"""

from __future__ import annotations

import dataclasses
from rlcode.errors import BadInput


@dataclasses.dataclass(frozen=True)
class Hardware:
  """Peak figures of one device, and how its devices are connected."""

  name: str
  flops: float              # dense bf16 FLOP/s
  hbm_bytes_per_s: float
  hbm_bytes: float
  link_bytes_per_s: float   # one direction, within an NVLink domain
  domain: int               # devices per NVLink domain
  network_bytes_per_s: float = 50e9  # one direction, between domains


GPUS = {
    "h200": Hardware("h200", 989e12, 4.8e12, 141e9, 450e9, 8),
    "gb200": Hardware("gb200", 2.5e15, 8.0e12, 186e9, 900e9, 72),
}


SYSTEMS = {"h200x8": ("h200", 8), "gb200-nvl72": ("gb200", 72)}


def resolve_devices(devices: str, hardware: str | None) -> tuple[int, Hardware]:
  """(device count, per-device figures) from --devices (a count or a system) and
  --hardware (a GPU of GPUS; default h200, or the system's)."""
  if devices in SYSTEMS:
    gpu, count = SYSTEMS[devices]
  elif devices.isdigit() and int(devices) > 0:
    gpu, count = "h200", int(devices)
  else:
    raise BadInput(f"--devices {devices!r}: expected a positive count or one of "
                   f"{sorted(SYSTEMS)}")
  gpu = hardware or gpu
  if gpu not in GPUS:
    raise BadInput(f"--hardware {gpu!r}: expected one of {sorted(GPUS)}")
  return count, GPUS[gpu]
