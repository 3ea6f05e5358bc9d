"""The MoE layer's forward + backward: grouped matmuls against the dense loop over experts.

One layer (rlcode.models.moe.MoE), one batch of tokens, float32, on this CPU, in one run:
best-of-N seconds of jit(value_and_grad) of sum(layer(x) * w) for each grouped-matmul
implementation, and their ratios to "dense" (every expert applied to every token and
masked: the loop over experts that grouped matmuls replace).

  tiled    each expert's rows padded to whole tiles, a scan of one matmul a tile (XLA:CPU's
           path: cost (M + X * tile) * K * N)
  ragged   jax.lax.ragged_dot (the accelerators' grouped GEMM; XLA:CPU lowers it to a
           masked product per expert, so here it costs what the dense loop does)
  dense    the reference

    python -m experiments.speed.moe_layer              # about 3 minutes on 2 quiet cores
    python -m experiments.speed.moe_layer --quick

Writes results/speed/moe_layer[_quick]/result.json (and its manifest).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.lib import results
from experiments.lib.timing import best_time
from rlcode.models import ModelConfig, MoEConfig, moe


def layer_step(impl: str, tokens: int, hidden: int, experts: int, top_k: int, width: int):
  """(jitted fwd+bwd of the layer, its inputs)."""
  cfg = ModelConfig(vocab_size=8, hidden_size=hidden, intermediate_size=width, num_layers=1,
                    num_heads=4, num_kv_heads=4,
                    moe=MoEConfig(num_experts=experts, top_k=top_k, intermediate_size=width,
                                  impl=impl))
  layer = moe.MoE(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(layer)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(1, tokens, hidden)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(1, tokens, hidden)), jnp.float32)

  def loss(params, x):
    out, _ = nnx.merge(graphdef, params)(x)
    return jnp.sum(out * w)
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1))), (params, x)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  shapes = (dict(tokens=256, hidden=64, experts=8, top_k=2, width=128) if args.quick else
            dict(tokens=2048, hidden=128, experts=16, top_k=2, width=256))
  rows = {}
  outputs = {}
  for impl in ("dense", "tiled", "ragged"):
    fn, inputs = layer_step(impl, **shapes)
    seconds = best_time(lambda: fn(*inputs), args.repeats)
    outputs[impl] = fn(*inputs)
    rows[impl] = {"ms": 1000 * seconds}
    print(f"{impl:7s} {1000 * seconds:9.1f} ms", flush=True)
  for impl in rows:
    rows[impl]["speedup_over_dense"] = rows["dense"]["ms"] / rows[impl]["ms"]
    diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), outputs[impl],
                        outputs["dense"])
    rows[impl]["max_abs_diff_to_dense"] = max(jax.tree.leaves(diff))
  payload = {"shapes": shapes, "rows": rows, "backend": jax.default_backend()}
  where = results.write("speed", "moe_layer_quick" if args.quick else "moe_layer", payload)
  for impl, row in rows.items():
    print(f"{impl}: {row['ms']:.1f} ms, {row['speedup_over_dense']:.2f}x the dense loop")
  print(f"wrote {where}")


if __name__ == "__main__":
  main()
