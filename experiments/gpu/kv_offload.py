"""Decoding over a long prompt whose KV lives in pinned host memory versus on the device.

Claim: streaming the prompt's KV from host
memory layer by layer (the next layer's copy issued before this layer
computes, `rlcode.models.decoder.Decoder.hidden`) costs almost nothing per
decode step up to about a million tokens of context.

Setup: Qwen2-0.5B's shapes (random bfloat16 weights), B rows each with its own
prompt of L tokens whose KV (random values: the step's cost does not depend
on them) is a head-major `Prefix`, either on the device or in pinned host
memory; --steps greedy decode steps of one token per row, the rows' own new
tokens in a device cache, timed as one compiled loop (best of --repeats after
a compile run). Reported per (L, B): time per step both ways and their
ratio, the prefix's bytes (the device memory offloading saves), the time to
copy the whole prefix to the device once, and the copy bandwidth a host step
implies (prefix bytes / host step time). A host step near max(device step,
copy time) means the copy is hidden up to its bandwidth; a ratio that grows
with L marks where it stops hiding behind compute. Each arm's compiled device
temporaries are recorded too: on the host arm they should stay far below the
prefix's bytes (only the layers in flight), or the copies left the loop.

    python -m experiments.gpu.kv_offload --out results/gpu/RUN   # GPU (gpu/check.sh)
    python -m experiments.gpu.kv_offload --smoke --out /tmp/smoke  # CPU, seconds

Configurations whose prefix exceeds --max-device-gib (device arm) or
--max-host-gib (host arm) are skipped and say so. --smoke: experiments.lib.shapes.TINY,
L = 64, B in {1, 2}, 4 steps (the CPU backend has the same memory
kinds, so both arms run). Writes kv_offload.json (rows as they finish) and the folder's
manifest.json to --out (default results/gpu/kv_offload[_smoke]).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.lib import results
from experiments.lib.shapes import QWEN2_05B, TINY, environment
from experiments.lib.tables import markdown
from experiments.lib.timing import best_time
from rlcode.models import Decoder
from rlcode.models.decoder import KVCache, Prefix


def prefix_bytes(cfg, batch: int, length: int) -> int:
  """Bytes of B rows' prompt KV of L tokens over every layer."""
  return (2 * cfg.num_layers * batch * cfg.num_kv_heads * length * cfg.head_dim
          * jnp.dtype(cfg.jnp_dtype).itemsize)


def make_prefix(cfg, batch: int, length: int, memory_kind: str) -> Prefix:
  """Random head-major prefix KV [B, K, L, D] per layer, placed in `memory_kind`.

  The lengths stay on the device: they are B integers, and the decode step
  computes positions from them.
  """
  device = jax.devices()[0]
  where = jax.sharding.SingleDeviceSharding(device, memory_kind=memory_kind)
  shape = (batch, cfg.num_kv_heads, length, cfg.head_dim)
  fill = jax.jit(lambda key: jax.random.normal(key, shape, cfg.jnp_dtype),
                 out_shardings=where)
  keys = jax.random.split(jax.random.key(0), 2 * cfg.num_layers)
  arrays = [fill(key) for key in keys]
  return Prefix(k=tuple(arrays[0::2]), v=tuple(arrays[1::2]),
                lengths=jnp.full((batch,), length, jnp.int32), head_major=True,
                on_host=memory_kind == "pinned_host")


def decode_loop(graphdef, steps: int):
  """`steps` greedy decode steps of one token per row over the prefix and a cache."""
  @jax.jit
  def run(state, prefix, cache, tok):
    model = nnx.merge(graphdef, state)

    def body(_, carry):
      tok, cache = carry
      h, cache = model.hidden(tok[:, None], cache=cache, prefix=prefix)
      return jnp.argmax(model.logits(h)[:, 0], axis=-1).astype(jnp.int32), cache
    return jax.lax.fori_loop(0, steps, body, (tok, cache))[0]
  return run


def copy_seconds(prefix: Prefix) -> float:
  """One host-to-device copy of the whole prefix."""
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="device")
  leaves = [*prefix.k, *prefix.v]
  t0 = time.perf_counter()
  copies = jax.block_until_ready([jax.device_put(x, device) for x in leaves])
  elapsed = time.perf_counter() - t0
  del copies
  return elapsed


def measure(model, cfg, *, length: int, batch: int, steps: int, repeats: int,
            max_device_gib: float, max_host_gib: float) -> dict:
  """One (L, B) row: the decode loop with the prefix on the device and in pinned host memory."""
  graphdef, state = nnx.split(model)
  run = decode_loop(graphdef, steps)
  nbytes = prefix_bytes(cfg, batch, length)
  row = dict(context=length, batch=batch, steps=steps, prefix_bytes=nbytes)
  tok = jnp.ones((batch,), jnp.int32)
  for arm, kind, limit in (("device", "device", max_device_gib),
                           ("host", "pinned_host", max_host_gib)):
    if nbytes > limit * 2 ** 30:
      row[f"{arm}_skipped"] = f"prefix {nbytes / 2 ** 30:.1f} GiB > {limit} GiB"
      continue
    try:
      prefix = make_prefix(cfg, batch, length, kind)
      cache = KVCache.zeros(cfg, batch, steps + 1)
      compiled = run.lower(state, prefix, cache, tok).compile()
      # Device temporaries near the prefix's size on the host arm would mean the
      # copies were hoisted out of the loop (the whole prefix resident on device).
      row[f"{arm}_temp_bytes"] = compiled.memory_analysis().temp_size_in_bytes
      seconds = best_time(lambda: compiled(state, prefix, cache, tok), repeats)
      row[f"{arm}_step_ms"] = seconds / steps * 1e3
      if arm == "host":
        row["copy_ms"] = copy_seconds(prefix) * 1e3
        row["host_step_gbps"] = nbytes / (seconds / steps) / 1e9
      prefix = None  # frees the prefix before the next arm's (the timed lambda holds it)
    except Exception as e:  # pylint: disable=broad-except  # a failed arm is reported
      row[f"{arm}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
  if "device_step_ms" in row and "host_step_ms" in row:
    row["host_over_device"] = row["host_step_ms"] / row["device_step_ms"]
  return row


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true", help="tiny model, runs on a CPU")
  parser.add_argument("--lengths", default="32768,131072,1048576")
  parser.add_argument("--batches", default="1,8")
  parser.add_argument("--steps", type=int, default=16)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--max-device-gib", type=float, default=100.0)
  parser.add_argument("--max-host-gib", type=float, default=48.0)
  parser.add_argument("--out", default=None,
                      help="the folder to write to (default results/gpu/kv_offload)")
  args = parser.parse_args(argv)
  if args.smoke:
    cfg, lengths, batches, steps, repeats = TINY, [64], [1, 2], 4, 1
  else:
    cfg, steps, repeats = QWEN2_05B, args.steps, args.repeats
    lengths = [int(x) for x in args.lengths.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  rows = []
  result = dict(environment=environment(), params=cfg.num_params(), rows=rows)
  name = "kv_offload" + ("_smoke" if args.smoke else "")
  for length in lengths:
    for batch in batches:
      rows.append(measure(model, cfg, length=length, batch=batch, steps=steps, repeats=repeats,
                          max_device_gib=args.max_device_gib, max_host_gib=args.max_host_gib))
      print(rows[-1], flush=True)
      results.write("gpu", name, result, into=args.out, filename="kv_offload.json")
  fmt = lambda r, k: f"{r[k]:.2f}" if k in r else "-"
  print(markdown(["context", "batch", "prefix GiB", "device ms/step", "host ms/step",
                  "host/device", "copy ms", "host step GB/s"],
                 [[r["context"], r["batch"], f"{r['prefix_bytes'] / 2 ** 30:.2f}",
                   fmt(r, "device_step_ms"), fmt(r, "host_step_ms"),
                   fmt(r, "host_over_device"), fmt(r, "copy_ms"), fmt(r, "host_step_gbps")]
                  for r in rows], "r" * 8))


if __name__ == "__main__":
  main()
