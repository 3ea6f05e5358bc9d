"""Attention cost versus sequence length: dense, sliding window, NSA and document.

Side by side in one run, batch 1, H=8 query heads, K=2 KV heads, D=64,
float32, causal:
  dense     jax.nn.dot_product_attention(is_causal=True): the library users already
            have (XLA on CPU, materialises T x T; cuDNN's fused kernel on a GPU)
  dense_blockwise
            kernels.attention, dense causal: our own blockwise kernel, which never
            builds T x T; against it, a kind's ratio is the effect of its mask alone
            (the window, the selection, the documents), not of avoiding T x T
  sliding   kernels.attention, AttentionSpec("sliding", window=512)
  nsa       kernels.nsa.nsa_attention with NSAConfig() (l=32, d=16, l'=64,
            n=16, w=512): compressed + selection (scores, top-k) + selected +
            sliding branches and the gates, given already-projected and
            compressed keys/values (the layer's projections and compression
            MLP are not timed)
  document  kernels.attention, AttentionSpec("document"), packed documents of
            1024 tokens, the last 1024 tokens being the final segment
impl="auto": the blockwise XLA versions on CPU, the Pallas kernels on GPU.

Each (kind, length, mode) runs in a fresh subprocess: it compiles, reads
`compiled.memory_analysis()` (XLA's buffer plan: arguments + outputs + temporaries),
skips the run when that plan exceeds --max-gib (dense runs out of memory
from 16k on), else runs once to warm up and times the best of up to
--repeats runs. Peak memory is reported two ways: the subprocess's peak RSS
(`resource.getrusage(...).ru_maxrss`, which includes the ~0.3 GiB of the JAX
runtime and the compiler) and XLA's buffer plan. On GPU the RSS is host memory;
read the buffer plan (and the device's peak_bytes_in_use, also recorded).

    python -m experiments.speed.attention_scaling            # full: 1k..32k (65k blockwise)
    python -m experiments.speed.attention_scaling --quick    # smoke run: 512 and 1024

Prints a table, writes result.json and attention_scaling.png (log-log time and memory
versus length) to --out (default results/speed/attention_scaling, with _IMPL_DTYPE when
--impl is not auto, and _quick with --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from experiments.lib import ROOT, results, tables

KINDS = ("dense", "dense_blockwise", "sliding", "nsa", "document")
MODES = ("fwd", "fwd+bwd")
H, K, D = 8, 2, 64
DOC = 1024


def _problem(kind: str, t: int, dtype: str = "float32", impl: str = "auto"):
  """(function, arguments) of one configuration; the function returns a scalar-able pytree."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  from rlcode import kernels  # pylint: disable=import-outside-toplevel
  from rlcode.kernels import nsa  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(0)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)
  q, k, v = normal(1, t, H, D), normal(1, t, K, D), normal(1, t, K, D)
  if kind == "dense":
    library = "cudnn" if jax.default_backend() == "gpu" else None
    return (lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                         implementation=library), (q, k, v))
  if kind == "dense_blockwise":
    return lambda q, k, v: kernels.attention(q, k, v, kernels.DENSE_CAUSAL, impl=impl), (q, k, v)
  if kind == "sliding":
    spec = kernels.AttentionSpec("sliding", window=512)
    return lambda q, k, v: kernels.attention(q, k, v, spec, impl=impl), (q, k, v)
  if kind == "document":
    spec = kernels.AttentionSpec("document")
    seg = jnp.asarray(np.arange(t) // DOC, jnp.int32)[None]
    return (lambda q, k, v: kernels.attention(q, k, v, spec, impl=impl, segment_ids=seg),
            (q, k, v))
  cfg = kernels.NSAConfig()
  nc = cfg.num_compressed(t)
  args = (q, normal(1, nc, K, D), normal(1, nc, K, D), k, v, normal(1, t, K, D),
          normal(1, t, K, D), jax.nn.sigmoid(normal(1, t, H, 3)))

  def fn(q, kc, vc, ks, vs, kw, vw, gates):
    return nsa.nsa_attention(q, (kc, vc), (ks, vs), (kw, vw), gates, cfg, impl=impl)
  return fn, args


def run_one(kind: str, t: int, mode: str, repeats: int, max_gib: float, budget_s: float,
            dtype: str = "float32", impl: str = "auto"):
  """Measures one configuration in this process; returns a result dict."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  fn, args = _problem(kind, t, dtype, impl)
  if mode == "fwd":
    step = fn
  else:
    def step(*a):
      def loss(*a):
        return jnp.sum(fn(*a).astype(jnp.float32) ** 2)
      return jax.grad(loss, argnums=tuple(range(len(a) - (kind == "nsa"))))(*a)
  t0 = time.perf_counter()
  compiled = jax.jit(step).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  plan = None
  if mem is not None:
    plan = (mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes)
  result = dict(kind=kind, t=t, mode=mode, compile_s=compile_s, xla_bytes=plan,
                backend=jax.default_backend(), dtype=dtype, impl=impl)
  if plan is not None and plan > max_gib * 2 ** 30:
    result["skipped"] = f"XLA buffer plan {plan / 2 ** 30:.1f} GiB > --max-gib {max_gib}"
    return result
  jax.block_until_ready(compiled(*args))
  times = []
  while len(times) < repeats and (not times or sum(times) < budget_s):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  result["seconds"] = min(times)
  result["runs"] = len(times)
  result["rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    result["device_peak_bytes"] = stats["peak_bytes_in_use"]
  return result


def _child(args) -> dict:
  """Runs one configuration in a fresh interpreter, so peak RSS is its own."""
  cmd = [sys.executable, "-m", "experiments.speed.attention_scaling", "--child", args[0],
         str(args[1]), args[2],
         "--repeats", str(args[3]), "--max-gib", str(args[4]), "--budget-s", str(args[5]),
         "--dtype", args[6], "--impl", args[7]]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode or not lines:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return dict(kind=args[0], t=args[1], mode=args[2], error=" | ".join(tail))
  return json.loads(lines[-1])


def _fmt_s(r):
  if r is None:
    return "-"
  if "seconds" in r:
    return f"{r['seconds'] * 1e3:.0f}"
  return "oom" if "skipped" in r else "err"


def _fmt_mib(x):
  return "-" if x is None else f"{x / 2 ** 20:.0f}"


def table(found) -> str:
  """Markdown table: one row per (kind, T), with speed ratios against both dense peers."""
  by = {(r["kind"], r["t"], r["mode"]): r for r in found}
  rows = []

  def ratio(base_kind, kind, t, mode):
    base, r = by.get((base_kind, t, mode)), by.get((kind, t, mode))
    if kind != base_kind and r and base and "seconds" in r and "seconds" in base:
      return f"{base['seconds'] / r['seconds']:.1f}x"
    return "-"
  for kind in KINDS:
    for t in sorted({r["t"] for r in found}):
      f, b = by.get((kind, t, "fwd")), by.get((kind, t, "fwd+bwd"))
      if f is None and b is None:
        continue
      ratios = [ratio(base, kind, t, mode) for base in ("dense", "dense_blockwise")
                for mode in MODES]
      rows.append([kind, t, _fmt_s(f), _fmt_s(b),
                   _fmt_mib(b.get("rss_bytes") if b else None),
                   _fmt_mib(b.get("xla_bytes") if b else None), *ratios])
  return tables.markdown(["kind", "T", "fwd ms", "fwd+bwd ms", "peak RSS fwd+bwd MiB",
                          "XLA plan fwd+bwd MiB", "dense/this fwd", "dense/this fwd+bwd",
                          "blockwise dense/this fwd", "blockwise dense/this fwd+bwd"],
                         rows, "l" + "r" * 9)


def plot(found, path: str) -> None:
  """Log-log time (fwd, fwd+bwd) and XLA buffer plan against length, a line a kind."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
  for kind in KINDS:
    for ax, mode in zip(axes[:2], MODES):
      pts = sorted((r["t"], r["seconds"]) for r in found
                   if r["kind"] == kind and r["mode"] == mode and "seconds" in r)
      if pts:
        ax.plot(*zip(*pts), marker="o", label=kind)
    pts = sorted((r["t"], r["xla_bytes"] / 2 ** 20) for r in found
                 if r["kind"] == kind and r["mode"] == "fwd+bwd" and r.get("xla_bytes"))
    if pts:
      axes[2].plot(*zip(*pts), marker="o", label=kind)
  titles = ("forward time (s)", "forward+backward time (s)",
            "fwd+bwd XLA buffer plan (MiB)")
  for ax, title in zip(axes, titles):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="smoke run: T in {512, 1024}")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--max-gib", type=float, default=12.0,
                      help="skip a configuration whose XLA buffer plan exceeds this")
  parser.add_argument("--budget-s", type=float, default=20.0,
                      help="stop repeating a configuration after this many seconds")
  parser.add_argument("--out", default=None,
                      help="the result's folder (default results/speed/attention_scaling...)")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--impl", default="auto",
                      help="kernels impl for sliding/nsa/document "
                           "(auto: Pallas on GPU, xla on CPU)")
  parser.add_argument("--lengths", default=None,
                      help="comma-separated T values (default 1k..65k, or 512,1024 with --quick)")
  parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of KINDS")
  parser.add_argument("--child", nargs=3, metavar=("KIND", "T", "MODE"), help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    kind, t, mode = args.child
    print(json.dumps(run_one(kind, int(t), mode, args.repeats, args.max_gib, args.budget_s,
                             args.dtype, args.impl)))
    return

  lengths = [512, 1024] if args.quick else [1024, 2048, 4096, 8192, 16384, 32768, 65536]
  if args.lengths:
    lengths = [int(x) for x in args.lengths.split(",")]
  kinds = [k for k in KINDS if k in args.kinds.split(",")]
  repeats = 1 if args.quick else args.repeats
  found = []
  for t in lengths:
    for kind in kinds:
      if (kind == "dense" and t > 32768) or (kind == "dense_blockwise" and t > 16384):
        continue  # the longest lengths are for the kinds whose cost grows ~linearly
      for mode in MODES:
        r = _child((kind, t, mode, repeats, args.max_gib, args.budget_s, args.dtype,
                    args.impl))
        found.append(r)
        status = (f"{r['seconds']:.3f}s" if "seconds" in r else r.get("skipped") or r.get("error"))
        print(f"{kind:9s} T={t:6d} {mode:8s} {status}", flush=True)

  by = {(r["kind"], r["t"], r["mode"]): r for r in found}
  targets = {}
  t_target = 8192  # the claim's length; a --quick run has no targets to check
  for kind, want in (("sliding", 10.0), ("nsa", 4.0)):
    for peer in ("dense", "dense_blockwise"):
      base, this = by.get((peer, t_target, "fwd")), by.get((kind, t_target, "fwd"))
      if base and this and "seconds" in base and "seconds" in this:
        ratio = base["seconds"] / this["seconds"]
        targets[f"{kind}_fwd_speedup_vs_{peer}_at_{t_target}"] = dict(
            ratio=ratio, target=want, met=ratio >= want)
  summary = dict(config=dict(batch=1, heads=H, kv_heads=K, head_dim=D, dtype=args.dtype,
                             impl=args.impl,
                             window=512, document_length=DOC, quick=args.quick),
                 results=found, targets=targets)
  stem = "attention_scaling" + (f"_{args.impl}_{args.dtype}" if args.impl != "auto"
                                else "")
  name = stem + ("_quick" if args.quick else "")
  where = args.out or results.folder("speed", name)
  results.write("speed", name, summary, into=where)
  print()
  print(table(found))
  print()
  for target, tgt in targets.items():
    print(f"{target}: {tgt['ratio']:.1f}x (target {tgt['target']:.0f}x: "
          f"{'met' if tgt['met'] else 'NOT met'})")
  plot(found, os.path.join(where, f"{stem}.png"))
  print("wrote", results.write("speed", name, summary, into=where,
                               files=[os.path.join(where, f"{stem}.png")]))


if __name__ == "__main__":
  main()
