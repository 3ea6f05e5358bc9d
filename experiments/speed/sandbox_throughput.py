"""Sandbox throughput: HumanEval reference solutions scored per second, isolation on.

Command (from the repository root):
  .venv/bin/python -m experiments.speed.sandbox_throughput [--workers N]

Scores all 164 HumanEval reference solutions through `rlcode.sandbox` (bubblewrap
namespaces, seccomp, rlimits, the tests in their own process calling the
program's through a plain-data channel, nonce-checked per-test report: the same
path the "tests" reward takes) with 1 and with 2 workers, side by side in one
run, and prints programs per second. The claim to reproduce: at least 10 programs/s on 2
cores with 2 workers. Writes result.json to --out (default
results/speed/sandbox_throughput). The load average before and after is recorded
because the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import time

from experiments.lib import results
from rlcode import sandbox
from rlcode.data.humaneval import humaneval_tasks
from rlcode.rewards.tests import job_for


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
  parser.add_argument("--out", default=None,
                      help="the result's folder (default results/speed/sandbox_throughput)")
  args = parser.parse_args()

  jobs = [job_for(t, t.reference) for t in humaneval_tasks()]
  load_before = os.getloadavg()[0]
  rows = []
  for workers in args.workers:
    box = sandbox.Sandbox(workers=workers)
    box.run(jobs[0])  # warm-up: page cache, probe
    cpu0, t0 = time.process_time(), time.perf_counter()
    scored = box.run_many(jobs)
    seconds = time.perf_counter() - t0
    rows.append({
        "workers": workers, "backend": box.backend, "programs": len(jobs),
        "passed": sum(r.passed for r in scored), "seconds": seconds,
        "programs_per_s": len(jobs) / seconds,
        "controller_cpu_s": time.process_time() - cpu0,
    })
  load_after = os.getloadavg()[0]
  base = rows[0]["programs_per_s"]
  print(f"{'workers':>7} {'backend':>8} {'programs':>8} {'passed':>6} {'seconds':>8} "
        f"{'prog/s':>7} {'ratio':>6} {'ctrl cpu s':>10}")
  for r in rows:
    print(f"{r['workers']:>7} {r['backend']:>8} {r['programs']:>8} {r['passed']:>6} "
          f"{r['seconds']:>8.2f} {r['programs_per_s']:>7.1f} {r['programs_per_s'] / base:>6.2f} "
          f"{r['controller_cpu_s']:>10.2f}")
  print(f"cpus available: {len(os.sched_getaffinity(0))}, load average (1 min) "
        f"before {load_before:.2f}, after {load_after:.2f}")
  record = {"rows": rows, "cpus": len(os.sched_getaffinity(0)),
            "load_before": load_before, "load_after": load_after}
  print("wrote", results.write("speed", "sandbox_throughput", record, into=args.out))


if __name__ == "__main__":
  main()
