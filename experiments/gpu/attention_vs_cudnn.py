"""Attention on a GPU against cuDNN: dense, sliding, document (16 documents) and NSA.

Claims, at bfloat16, B=1, 32 query heads, 8 KV heads, head_dim 128:
`impl="auto"` serves dense and sliding attention through cuDNN (so it is as
fast as cuDNN); document attention with 16 equal documents is at least 4x
faster than cuDNN dense-causal forward and 3x forward+backward at 32k; NSA
(NSAConfig(): l=32, d=16, l'=64, n=16, w=512; branches from already
projected and compressed keys, as in attention_scaling.py) at least 5x / 4x
at 64k.

Rows, each timed in this process (best of --repeats after a compile run, at
most --budget-s per row):
  cudnn_dense   jax.nn.dot_product_attention(is_causal=True, implementation=
                --baseline): the reference row every ratio divides
  dense         kernels.attention, dense causal, impl="auto" and "pallas"
  sliding       kernels.attention, window --window, impl="auto" and "pallas"
  document      kernels.attention, 16 equal documents, impl="auto"
  nsa           kernels.nsa.nsa_attention, impl="auto"
fwd+bwd is the gradient of sum(out * w) for a fixed random w, w.r.t. q, k, v
(NSA: every branch input but the gates). The dense rows also report their
largest difference from the baseline's output; each row records what it runs
as (the dispatcher's answer, "auto" resolved).

    python -m experiments.gpu.attention_vs_cudnn --out results/gpu/RUN   # GPU (gpu/check.sh)
    python -m experiments.gpu.attention_vs_cudnn --smoke --out /tmp/smoke  # CPU, seconds

--smoke: tiny shapes (T = 128, 4 heads, 2 KV heads, head_dim 16, float32),
the library's implementation="xla" as the baseline and no impl="pallas" rows
(off a GPU they would repeat "auto"), so it runs on a CPU. Writes
attention_vs_cudnn.json (rows as they finish) and the folder's manifest.json to --out
(default results/gpu/attention_vs_cudnn[_smoke]).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np

from experiments.lib import results
from experiments.lib.shapes import environment
from experiments.lib.tables import markdown
from experiments.lib.timing import timed
from rlcode import kernels
from rlcode.kernels import dispatch, nsa

DOCUMENTS = 16
# (kind, T, fwd ratio, fwd+bwd ratio) that the claims ask of ours against cudnn_dense.
TARGETS = (("document", 32768, 4.0, 3.0), ("nsa", 65536, 5.0, 4.0))
SMOKE_NSA = kernels.NSAConfig(block_cmp=16, stride_cmp=8, block_sel=32, num_sel=4, window=64)


def _with_grad(fn, n_diff: int):
  """fwd+bwd: gradients of sum(out * w) w.r.t. the first n_diff arguments (w is last)."""
  def step(*args):
    *inputs, w = args
    loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * w)
    return jax.grad(loss, argnums=tuple(range(n_diff)))(*inputs)
  return step


def problems(t: int, *, heads: int, kv_heads: int, head_dim: int, dtype, window: int,
             baseline: str, nsa_cfg: kernels.NSAConfig):
  """name -> (impl label, function, inputs) for one length."""
  keys = iter(jax.random.split(jax.random.key(0), 16))
  normal = lambda *shape: jax.random.normal(next(keys), shape, dtype)
  q, k, v = normal(1, t, heads, head_dim), normal(1, t, kv_heads, head_dim), \
      normal(1, t, kv_heads, head_dim)
  dense, sliding = kernels.AttentionSpec(), kernels.AttentionSpec("sliding", window=window)
  seg = jnp.asarray(np.arange(t) * DOCUMENTS // t, jnp.int32)[None]
  out = {"cudnn_dense": (baseline, lambda q, k, v: jax.nn.dot_product_attention(
      q, k, v, is_causal=True, implementation=baseline), (q, k, v))}
  # The rows the claims are about first, so a run cut by its time limit keeps them.
  out["document/auto"] = ("auto", lambda q, k, v: kernels.attention(
      q, k, v, kernels.AttentionSpec("document"), segment_ids=seg), (q, k, v))
  nc = nsa_cfg.num_compressed(t)
  nsa_args = (q, normal(1, nc, kv_heads, head_dim), normal(1, nc, kv_heads, head_dim), k, v,
              normal(1, t, kv_heads, head_dim), normal(1, t, kv_heads, head_dim),
              jax.nn.sigmoid(normal(1, t, heads, 3)))
  out["nsa/auto"] = ("auto", lambda q, kc, vc, ks, vs, kw, vw, g: nsa.nsa_attention(
      q, (kc, vc), (ks, vs), (kw, vw), g, nsa_cfg), nsa_args)
  for impl in ("auto", "pallas"):
    out[f"dense/{impl}"] = (impl, lambda q, k, v, impl=impl: kernels.attention(
        q, k, v, dense, impl=impl), (q, k, v))
    out[f"sliding/{impl}"] = (impl, lambda q, k, v, impl=impl: kernels.attention(
        q, k, v, sliding, impl=impl), (q, k, v))
  return out


def _chosen(name: str, impl: str, q, k, window: int) -> str:
  """What the row runs: the dispatcher's own answer for our rows."""
  kind = name.split("/")[0]
  if kind == "cudnn_dense":
    return f"library:{impl}"
  if kind == "nsa":
    return dispatch.choose(impl, family="nsa", backend=jax.default_backend()).impl
  spec = {"dense": kernels.AttentionSpec(), "document": kernels.AttentionSpec("document"),
          "sliding": kernels.AttentionSpec("sliding", window=window)}[kind]
  return dispatch.choose(impl, family="attention", backend=jax.default_backend(), spec=spec,
                         q_shape=q.shape, k_shape=k.shape, dtype=q.dtype).impl


def run(lengths, *, heads, kv_heads, head_dim, dtype, window, baseline, nsa_cfg, repeats,
        budget_s, into, name, skip=()) -> dict:
  """Every row at every length, each written to OUT/attention_vs_cudnn.json as it finishes."""
  save = lambda: results.write("gpu", name, summary, into=into,
                               filename="attention_vs_cudnn.json")
  rows = []
  summary = dict(config=dict(batch=1, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                             dtype=jnp.dtype(dtype).name, window=window, documents=DOCUMENTS,
                             baseline=baseline, nsa=dataclasses.asdict(nsa_cfg)),
                 environment=environment(), rows=rows)
  for t in lengths:
    probs = problems(t, heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype,
                     window=window, baseline=baseline, nsa_cfg=nsa_cfg)
    base_out = None
    for name, (impl, fn, args) in probs.items():
      if name in skip:
        continue
      row = dict(name=name, t=t, impl=impl, runs_as=_chosen(name, impl, args[0], args[1], window))
      try:
        w = jax.random.normal(jax.random.key(1), args[0].shape, jnp.float32)
        row["fwd"], out = timed(fn, args, repeats, budget_s)
        if name == "cudnn_dense":
          base_out = out.astype(jnp.float32)
        elif name.startswith("dense") and base_out is not None:
          row["max_abs_diff_vs_baseline"] = float(jnp.max(jnp.abs(
              out.astype(jnp.float32) - base_out)))
        del out
        row["fwd_bwd"], _ = timed(_with_grad(fn, len(args) - (name == "nsa/auto")),
                                  (*args, w), repeats, budget_s)
      except Exception as e:  # pylint: disable=broad-except  # a failed row is reported
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
      rows.append(row)
      print(json.dumps(row), flush=True)
      save()
  summary["targets"] = targets(rows)
  save()
  return summary


def targets(rows) -> dict:
  """Ours against cudnn_dense where the claims set a ratio."""
  by = {(r["name"], r["t"]): r for r in rows if "error" not in r}
  out = {}
  for kind, t, want_fwd, want_bwd in TARGETS:
    base, ours = by.get(("cudnn_dense", t)), by.get((f"{kind}/auto", t))
    if base and ours:
      fwd = base["fwd"]["ms"] / ours["fwd"]["ms"]
      bwd = base["fwd_bwd"]["ms"] / ours["fwd_bwd"]["ms"]
      out[f"{kind}_at_{t}"] = dict(fwd_speedup=fwd, fwd_target=want_fwd,
                                   fwd_bwd_speedup=bwd, fwd_bwd_target=want_bwd,
                                   met=fwd >= want_fwd and bwd >= want_bwd)
  return out


def table(rows) -> str:
  """The rows by length with their ratios to cuDNN dense."""
  base = {r["t"]: r for r in rows if r["name"] == "cudnn_dense" and "error" not in r}
  rows = sorted(rows, key=lambda r: r["t"])  # stable: each length's rows in run order
  lines = []
  for r in rows:
    if "error" in r:
      lines.append([r["t"], r["name"], r["runs_as"], "error", r["error"][:60], "-", "-"])
      continue
    b = base.get(r["t"])
    ratio = lambda m: f"{b[m]['ms'] / r[m]['ms']:.2f}x" if b else "-"
    lines.append([r["t"], r["name"], r["runs_as"], f"{r['fwd']['ms']:.2f}",
                  f"{r['fwd_bwd']['ms']:.2f}", ratio("fwd"), ratio("fwd_bwd")])
  return markdown(["T", "row", "runs as", "fwd ms", "fwd+bwd ms", "cuDNN dense / this fwd",
                   "cuDNN dense / this fwd+bwd"], lines, "rllrrrr")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true", help="tiny shapes, runs on a CPU")
  parser.add_argument("--lengths", default="32768,65536,8192",
                      help="in the order run (the claims' lengths first)")
  parser.add_argument("--window", type=int, default=512)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--budget-s", type=float, default=2.0)
  parser.add_argument("--skip", default="", help="comma-separated row names not to run")
  parser.add_argument("--out", default=None,
                      help="the folder to write to (default results/gpu/attention_vs_cudnn)")
  args = parser.parse_args(argv)
  if args.smoke:
    sizes = dict(heads=4, kv_heads=2, head_dim=16, dtype=jnp.float32, window=32,
                 baseline="xla", nsa_cfg=SMOKE_NSA)
    lengths, repeats = [128], 1
    # Off a GPU "pallas" falls back to what "auto" runs: those rows would repeat it.
    args.skip = args.skip or "dense/pallas,sliding/pallas"
  else:
    sizes = dict(heads=32, kv_heads=8, head_dim=128, dtype=jnp.bfloat16, window=args.window,
                 baseline="cudnn", nsa_cfg=kernels.NSAConfig())
    lengths, repeats = [int(x) for x in args.lengths.split(",")], args.repeats
  summary = run(lengths, repeats=repeats, budget_s=args.budget_s,
                into=args.out, name="attention_vs_cudnn" + ("_smoke" if args.smoke else ""),
                skip=tuple(s for s in args.skip.split(",") if s), **sizes)
  print()
  print(table(summary["rows"]))
  for name, tgt in summary["targets"].items():
    print(f"{name}: fwd {tgt['fwd_speedup']:.2f}x (target {tgt['fwd_target']}x), fwd+bwd "
          f"{tgt['fwd_bwd_speedup']:.2f}x (target {tgt['fwd_bwd_target']}x): "
          f"{'met' if tgt['met'] else 'NOT met'}")


if __name__ == "__main__":
  main()
