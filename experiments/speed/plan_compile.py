"""How long `rlcode plan` takes with scanned layers against looped ones, in one run.

The 7B Qwen2 shapes (configs/qwen2_7b_plan.py, 28 layers) on a GB200 NVL72 rack's 72
devices, trainer data=8,fsdp=8 and sampler data=2,tensor=4: the wall clock of the whole
plan (a fresh process: JAX's start, the update's and the decode loop's compiles) with
`model.scan_layers` true and false, the same features otherwise. Target: the scanned
plan at most half the looped one.

    python -m experiments.speed.plan_compile          # about 5 minutes on 2 cores

Writes results/speed/plan_compile/result.json.
"""

from __future__ import annotations

from experiments.lib import results
from experiments.speed import plan_rows

ARGS = ["--config", "configs/qwen2_7b_plan.py", "--devices", "gb200-nvl72", "--mesh",
        "data=8,fsdp=8", "--sampler-mesh", "data=2,tensor=4"]


def plan_seconds(scan: bool) -> tuple[float, dict]:
  seconds, _, report = plan_rows.plan_row(
      [*ARGS, f"--config.model.scan_layers={str(scan).lower()}"])
  return seconds, report


def main() -> None:
  rows = {}
  for scan in (False, True):
    seconds, report = plan_seconds(scan)
    up = report["result"]["update"]
    rows["scanned" if scan else "looped"] = {
        "seconds": seconds, "update_peak_bytes": up["memory"]["peak"]}
    print(f"scan_layers={scan}: {seconds:.1f} s, update peak {up['memory']['peak'] / 1e9:.2f} GB")
  ratio = rows["scanned"]["seconds"] / rows["looped"]["seconds"]
  print(f"scanned / looped wall clock: {ratio:.2f} (target <= 0.5)")
  results.write("speed", "plan_compile", {"rows": rows, "ratio": ratio, "target": 0.5,
                                          "args": ARGS})


if __name__ == "__main__":
  main()
