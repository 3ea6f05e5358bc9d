"""Where a decode step's time goes: kernel time against the step's wall-clock, per XLA setting.

decode_roofline.py measures a step of `rlcode.sampling.generate` at 5.9x the
HBM bound (Qwen2-0.5B shapes, batch 64). Two explanations predict
different things: if the step waits on kernel launches, the GPU's kernels are
busy for a small part of the step and capturing the loop body as a CUDA graph
(XLA's command buffers) moves it; if the kernels themselves are slow, the busy
time is close to the step time and names the kernels to fix.

For each --variant (a name and the XLA_FLAGS it adds), in its own process
(XLA reads its flags once): experiments.lib.decode_step.measure's step time (the one
decode_roofline.py tables), then one
prefill and one generate traced with `jax.profiler`, read back with
`jax.profiler.ProfileData`. The device's kernel time in the generate trace
minus the prefill's, over the new tokens after the first, is the kernel time
per decode step; busy_fraction is that over the (untraced, best of 2) step
time. Both are approximate by a few percent: the traced prefill is the
prompts' forward alone (generate's also fills the cache), and kernels are summed
over the device's streams (overlap would count twice). The kernels that take
most of it are listed with their time and launches per step (prefill's
subtracted by name). Kernels that run inside a CUDA graph of a while loop are
not traced (seen with "graphs_while": 2 launches a step): such a row has
kernels_traced False and its kernel columns are void.

    python -m experiments.gpu.decode_profile --out results/gpu/RUN   # GPU (gpu/check.sh), ~2 minutes
    python -m experiments.gpu.decode_profile --smoke --out /tmp/smoke  # CPU, seconds

--smoke: the TINY model (decode_roofline's smoke sizes), the default variant
only; on a CPU there is no device plane, so the kernel columns read 0.
Writes decode_profile.json (rows as variants finish) and the folder's manifest.json to
--out (default results/gpu/decode_profile[_smoke]).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile

from experiments.lib import ROOT

# name -> XLA_FLAGS added. "graphs_off" turns XLA's command buffers off; "graphs_while"
# also captures while loops and conditionals (the decode loop) into them; "cublas" sends
# the matrix products to cuBLAS instead of XLA's Triton GEMM fusions (on 2026-12-04 the
# four per-layer products, 64 rows each, ran at 4x their bytes as Triton fusions).
VARIANTS = {
    "default": "",
    "cublas": "--xla_gpu_enable_triton_gemm=false",
    "graphs_off": "--xla_gpu_enable_command_buffer=",
    "graphs_while": ("--xla_gpu_enable_command_buffer="
                     "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"),
}
TOP = 12


def device_kernels(path: str) -> tuple[float, collections.Counter, collections.Counter]:
  """(kernel seconds, seconds by kernel name, launches by name) on the device planes of a trace."""
  from jax.profiler import ProfileData
  total, by_time, by_count = 0.0, collections.Counter(), collections.Counter()
  for plane in ProfileData.from_file(path).planes:
    if not plane.name.startswith("/device:"):
      continue
    # Kernels and copies are on the "Stream #N" lines; other lines (XLA Ops, Modules)
    # restate the same time and are left out.
    for line in (line for line in plane.lines if line.name.startswith("Stream")):
      for event in line.events:
        seconds = event.duration_ns * 1e-9
        total += seconds
        by_time[event.name] += seconds
        by_count[event.name] += 1
  return total, by_time, by_count


def traced_kernels(fn) -> tuple[float, collections.Counter, collections.Counter]:
  """device_kernels of one traced call of fn (the trace is read, then removed)."""
  import jax
  with tempfile.TemporaryDirectory(prefix="decode_profile_") as out:
    with jax.profiler.trace(out):
      jax.block_until_ready(fn())
    (path,) = glob.glob(os.path.join(out, "**", "*.xplane.pb"), recursive=True)
    return device_kernels(path)


def child(smoke: bool, batch: int, prompt: int, new: int) -> dict:
  """Runs in the variant's process: the step time, then the traced kernel time."""
  from experiments.lib import decode_step
  from experiments.lib.shapes import H200_HBM_BYTES_PER_S, QWEN2_05B, TINY

  cfg = TINY if smoke else QWEN2_05B
  prefill, gen = work = decode_step.workload(cfg, batch=batch, prompt=prompt, new=new)
  # Compiles both and times them untraced (best of 2), then each is traced once.
  row = decode_step.measure(cfg, batch=batch, prompt=prompt, new=new, repeats=2,
                            hbm=H200_HBM_BYTES_PER_S, work=work)
  pre_s, pre_t, pre_n = traced_kernels(prefill)
  gen_s, gen_t, gen_n = traced_kernels(gen)
  steps = max(new - 1, 1)
  per_step_s = max(gen_s - pre_s, 0.0) / steps
  decode_t = collections.Counter({name: seconds - pre_t[name] for name, seconds in gen_t.items()
                                  if seconds > pre_t[name]})
  top = [dict(name=name[:120], ms_per_step=seconds / steps * 1e3,
              launches_per_step=max(gen_n[name] - pre_n[name], 0) / steps)
         for name, seconds in decode_t.most_common(TOP)]
  launches = max(sum(gen_n.values()) - sum(pre_n.values()), 0) / steps
  return dict(step_ms=row["step_ms"], bound_ms=row["bound_ms"],
              ratio_to_bound=row["ratio_to_bound"], kernel_ms_per_step=per_step_s * 1e3,
              busy_fraction=per_step_s * 1e3 / row["step_ms"] if row["step_ms"] > 0 else 0.0,
              launches_per_step=launches, kernels_traced=launches >= 10, top_kernels=top)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true", help="tiny model, runs on a CPU")
  parser.add_argument("--variant", action="append", choices=sorted(VARIANTS),
                      help="XLA settings to profile (default: all; --smoke: default)")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--prompt-len", type=int, default=128)
  parser.add_argument("--new-tokens", type=int, default=256)
  parser.add_argument("--timeout", type=float, default=240, help="seconds per variant")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--out", default=None,
                      help="the folder to write to (default results/gpu/decode_profile)")
  args = parser.parse_args(argv)
  sizes = (2, 8, 8) if args.smoke else (args.batch, args.prompt_len, args.new_tokens)
  if args.child:
    print(json.dumps(child(args.smoke, *sizes)))
    return
  from experiments.lib import results
  from experiments.lib.shapes import environment
  variants = args.variant or (["default"] if args.smoke else list(VARIANTS))
  rows = []
  for name in variants:
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(f for f in (env.get("XLA_FLAGS", ""), VARIANTS[name]) if f)
    cmd = [sys.executable, "-m", "experiments.gpu.decode_profile", "--child"] + (
        ["--smoke"] if args.smoke else [])
    cmd += ["--batch", str(args.batch), "--prompt-len", str(args.prompt_len),
            "--new-tokens", str(args.new_tokens)]
    row = dict(variant=name, xla_flags=VARIANTS[name], batch=sizes[0], prompt=sizes[1],
               new_tokens=sizes[2])
    try:
      proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=args.timeout, check=False)
      if proc.returncode == 0:
        row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
      else:
        row["error"] = proc.stderr.strip().splitlines()[-1][:300] if proc.stderr.strip() else \
            f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
      row["error"] = f"timed out after {args.timeout:.0f} s"
    rows.append(row)
    results.write("gpu", "decode_profile" + ("_smoke" if args.smoke else ""),
                  dict(environment=environment(), rows=rows), into=args.out,
                  filename="decode_profile.json")
    if "error" in row:
      print(f"{name}: {row['error']}", flush=True)
      continue
    void = "" if row["kernels_traced"] else " (kernels not traced: columns void)"
    print(f"{name}: step {row['step_ms']:.3f} ms ({row['ratio_to_bound']:.2f}x the bound), "
          f"kernels {row['kernel_ms_per_step']:.3f} ms/step ({row['busy_fraction']:.0%} busy), "
          f"{row['launches_per_step']:.0f} launches/step{void}", flush=True)
    for k in row["top_kernels"]:
      print(f"   {k['ms_per_step']:8.4f} ms/step {k['launches_per_step']:6.1f}x  {k['name']}",
            flush=True)
  if all("error" in row for row in rows):
    sys.exit(1)


if __name__ == "__main__":
  main()
