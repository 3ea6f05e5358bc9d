"""Serving throughput: continuous batching vs one request at a time, and redeploy latency.

    python -m experiments.speed.serve_throughput [--clients 1,4,16,64] [--tokens 32]

Three `rlcode serve` processes of the default job's tiny policy (configs/online_tiny.py,
random weights: every request decodes its whole budget), side by side in one run:
  continuous   serve.batching=continuous, 64 decode slots
  serial       serve.batching=serial on the same 64-slot compiled step (one request at a
               time: the same program, the other slots idle)
  serial-1     one slot: the cheapest program for one request at a time
At each concurrency c, c clients (httpx, loopback) send max(16, 2c) requests of `--tokens`
tokens each; throughput is completion tokens per wall-clock second. Then the redeploy
time: while a client keeps asking, new weights are published to the continuous server's
workdir/published; the time from the file's rename to the first response carrying the new
policy version (serve.watch_seconds=0.2 polling included), 5 versions. transformers'
server needs torch, which this environment does not install: not compared. Writes
results/speed/serve_throughput/.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import httpx

from experiments.lib import ROOT, results
from experiments.lib.serving import start_server

CONFIG = os.path.join(ROOT, "configs", "online_tiny.py")
MODEL = "rlcode-tiny"
ARMS = {"continuous": ["--config.serve.slots=64", "--config.serve.batching=continuous"],
        "serial": ["--config.serve.slots=64", "--config.serve.batching=serial"],
        "serial-1": ["--config.serve.slots=1", "--config.serve.batching=serial"]}


async def load(url: str, clients: int, requests: int, tokens: int) -> dict:
  """`requests` requests from `clients` concurrent clients; tokens per second."""
  todo = list(range(requests))
  counted = []

  async def client(http):
    while todo:
      i = todo.pop()
      r = await http.post("/v1/completions", json={
          "model": MODEL, "prompt": "def f_%d(x):\n" % i, "max_tokens": tokens,
          "temperature": 1.0, "seed": i})
      r.raise_for_status()
      counted.append(r.json()["usage"]["completion_tokens"])

  async with httpx.AsyncClient(base_url=url, timeout=600,
                               limits=httpx.Limits(max_connections=clients)) as http:
    await client_warm(http, tokens)
    start = time.perf_counter()
    await asyncio.gather(*(client(http) for _ in range(clients)))
    seconds = time.perf_counter() - start
  return {"clients": clients, "requests": requests, "tokens": sum(counted),
          "seconds": seconds, "tokens_per_s": sum(counted) / seconds}


async def client_warm(http, tokens):
  """One request first, so no arm pays a compile inside its measurement."""
  r = await http.post("/v1/completions", json={"model": MODEL, "prompt": "def warm():\n",
                                               "max_tokens": tokens})
  r.raise_for_status()


async def redeploy(url: str, workdir: str, versions: int) -> list[float]:
  """Seconds from a version's publication to the first response that carries it."""
  from flax import nnx

  from rlcode.config import loader
  from rlcode.models.build import build_model
  from rlcode.parallel import sharding
  from rlcode.serve import weights
  config = loader.load_config(CONFIG, [f"--config.workdir={workdir}",
                                       "--config.online.init_from="])
  model, _ = build_model(config.model, sharding.make_mesh(), config.seed)
  _, params = nnx.split(model, nnx.Param)
  out = []
  async with httpx.AsyncClient(base_url=url, timeout=600) as http:
    for version in range(1, versions + 1):
      weights.publish(os.path.join(workdir, "published"), version, params)
      published = time.perf_counter()
      while True:
        r = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                     "max_tokens": 1})
        if r.json()["policy_version"] >= version:
          out.append(time.perf_counter() - published)
          break
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", default="1,4,16,64")
  parser.add_argument("--tokens", type=int, default=32)
  parser.add_argument("--versions", type=int, default=5)
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "out", "serve_speed"))
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  levels = [int(c) for c in args.clients.split(",")]
  table, servers = {}, {}
  try:
    for arm, flags in ARMS.items():
      workdir = os.path.join(args.out, arm)
      servers[arm] = start_server(CONFIG, [f"--config.workdir={workdir}",
                                           "--config.online.init_from=", *flags],
                                  os.path.join(args.out, f"{arm}.log")) + (workdir,)
    for c in levels:
      for arm in ARMS:
        _, url, _ = servers[arm]
        row = asyncio.run(load(url, c, max(16, 2 * c), args.tokens))
        table.setdefault(arm, []).append(row)
        print(f"{arm:10s} clients={c:3d} {row['tokens_per_s']:8.1f} tokens/s", flush=True)
    _, url, workdir = servers["continuous"]
    times = asyncio.run(redeploy(url, workdir, args.versions))
  finally:
    for proc, _, _ in servers.values():
      proc.stop()
  ratios = {f"{c}": {"vs_serial": table["continuous"][i]["tokens_per_s"]
                     / table["serial"][i]["tokens_per_s"],
                     "vs_serial_1": table["continuous"][i]["tokens_per_s"]
                     / table["serial-1"][i]["tokens_per_s"]} for i, c in enumerate(levels)}
  payload = {"throughput": table, "ratio": ratios, "redeploy_seconds": times,
             "redeploy_median_s": statistics.median(times), "tokens": args.tokens,
             "transformers_serve": "not run: torch is not installed in this environment"}
  print(ratios, "redeploy median", payload["redeploy_median_s"])
  results.write("speed", "serve_throughput", payload)


if __name__ == "__main__":
  main()
