"""The `rlcode plan` table of docs/results.md, every row planned again in one run.

Each row is one `rlcode plan` command (a fresh process: fake CPU devices, XLA's memory
analysis of the update and of the engine's step). Its printout is kept beside the result
as <row>.txt, and result.json holds each row's headline figures: the update's and the
sampling's per-device peaks, whether both fit the hardware, and the estimated GRPO step.

    python -m experiments.speed.plan_rows                 # every row: 5-10 minutes on 2 cores
    python -m experiments.speed.plan_rows --rows 7b_h200x8 qwen3_8b_32k

Writes results/speed/plan_rows (or --name).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from experiments.lib import ROOT, results
from rlcode.plan.hardware import GPUS

Q7 = ["--config", "configs/qwen2_7b_plan.py"]
LONG = ["--config.rl.max_new_tokens=4096"]
Q32 = ["--config", "configs/qwen2_32b_plan.py", "--devices", "gb200-nvl72",
       "--prompt-len", "131072"]
ROWS = {
    "7b_h200x8": [*Q7, "--devices", "h200x8", "--mesh", "fsdp=8"],
    "7b_gb200": [*Q7, "--devices", "gb200-nvl72", "--mesh", "data=8,fsdp=8",
                 "--sampler-mesh", "data=2,tensor=4"],
    "7b_32k": [*Q7, "--devices", "h200x8", "--mesh", "fsdp=4,context=2", "--prompt-len",
               "32768", *LONG, "--config.model.arch.max_seq_len=36864"],
    "7b_131k_one_prompt": [*Q7, "--devices", "h200x8", "--mesh", "context=8", "--prompt-len",
                           "131072", "--config.rl.prompts_per_step=1", *LONG,
                           "--config.model.arch.max_seq_len=139264"],
    "7b_131k_micro_offload": [*Q7, "--devices", "h200x8", "--mesh", "context=8",
                              "--prompt-len", "131072", *LONG,
                              "--config.model.arch.max_seq_len=139264",
                              "--config.rl.micro_batch_rows=8",
                              "--config.optimizer.offload=true"],
    "7b_lora_one_h200": [*Q7, "--devices", "1", "--hardware", "h200", "--mesh", "fsdp=1",
                         "--config.model.lora.rank=64",
                         "--config.model.lora.base_dtype=bfloat16"],
    "qwen3_30b_a3b_expert": ["--config", "configs/qwen3_30b_a3b_plan.py", "--devices",
                             "h200x8", "--mesh", "fsdp=2,expert=4"],
    "qwen3_8b_32k": ["--config", "configs/qwen3_8b_plan.py", "--devices", "h200x8", "--mesh",
                     "fsdp=4,context=2"],
    "32b_131k": [*Q32, "--mesh", "fsdp=8,context=8", "--sampler-mesh", "data=1,tensor=8"],
    "32b_131k_sampler_context": [*Q32, "--mesh", "fsdp=8,context=8", "--sampler-mesh",
                                 "context=8"],
    "32b_131k_32_devices": [*Q32, "--mesh", "fsdp=4,context=8", "--sampler-mesh",
                            "data=4,tensor=8"],
    "32b_131k_micro_offload": [*Q32, "--mesh", "fsdp=4,context=8", "--sampler-mesh",
                               "data=4,tensor=8", "--config.rl.micro_batch_rows=32",
                               "--config.optimizer.offload=true"],
}


def plan_row(argv: list[str]) -> tuple[float, str, dict]:
  """(seconds, the printed table, the --json report) of one `rlcode plan`, compiled from
  nothing: the persistent compilation cache off, so the seconds are a plan's own."""
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR="")
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "plan.json")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rlcode", "plan", *argv, "--json", out],
                          cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    with open(out) as f:
      return seconds, done.stdout, json.load(f)


def headline(report: dict) -> dict:
  result, est = report["result"], report["estimate"]
  update, sample = result["update"]["memory"]["peak"], result["decode"]["memory"]["peak"]
  hbm = GPUS[report["hardware"]].hbm_bytes
  return {"hardware": report["hardware"], "update_peak_gb": update / 1e9,
          "sampling_peak_gb": sample / 1e9, "fits": max(update, sample) <= hbm,
          "step_seconds": est.get("step"), "train_seconds": est.get("train"),
          "sample_seconds": est.get("sample")}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
  parser.add_argument("--name", default="plan_rows")
  args = parser.parse_args(argv)
  rows, files = {}, []
  with tempfile.TemporaryDirectory() as tmp:
    for name in args.rows:
      try:
        seconds, table, report = plan_row(ROWS[name])
      except subprocess.CalledProcessError as e:  # a refusal is a row too
        rows[name] = {"command": ["rlcode", "plan", *ROWS[name]],
                      "failed": (e.stderr or e.stdout).strip().splitlines()[-1:]}
        print(f"{name}: failed: {rows[name]['failed']}", flush=True)
        continue
      rows[name] = {"command": ["rlcode", "plan", *ROWS[name]], "seconds": seconds,
                    **headline(report)}
      path = os.path.join(tmp, f"{name}.txt")
      with open(path, "w") as f:
        f.write(table)
      files.append(path)
      print(f"{name}: update {rows[name]['update_peak_gb']:.2f} GB, sampling "
            f"{rows[name]['sampling_peak_gb']:.2f} GB, step {rows[name]['step_seconds']:.3g} s"
            f" ({seconds:.0f} s to plan)", flush=True)
    results.write("speed", args.name, {"rows": rows}, files=files)


if __name__ == "__main__":
  main()
