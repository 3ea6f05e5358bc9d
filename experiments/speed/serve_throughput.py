"""Serving throughput: continuous batching vs one request at a time, against today's and an
earlier rlcode and against transformers, and redeploy latency.

    python -m experiments.speed.serve_throughput [--clients 1,4,16,64] [--tokens 32]
        [--transformers VENV/bin/transformers] [--baseline-commit d555ef3]

Three `rlcode serve` processes of the default job's tiny policy (configs/online_tiny.py,
random weights: every request decodes its whole budget), side by side in one run:
  continuous   serve.batching=continuous, 64 slots, the paged engine's defaults otherwise
               (serve.page_size=16, serve.kv_pages=None: the memory of 64 whole-context
               caches)
  serial       serve.batching=serial, 64 slots (one request at a time on the same engine)
  serial-1     one slot: the cheapest program for one request at a time
At each concurrency c, c clients (httpx, loopback) send max(16, 2c) requests of `--tokens`
tokens each; throughput is completion tokens per wall-clock second. Then the redeploy
time: while a client keeps asking, new weights are published to the continuous server's
workdir/published; the time from the file's rename to the first response carrying the new
policy version: writing the file, the server's polling (serve.watch_seconds=0.2), loading
and the swap included; `--redeploy-only` measures that alone (10 versions, redeploy.json).

With --transformers (the `transformers` command of a separate environment with torch,
`pip install torch transformers[serving] accelerate`: its --device needs accelerate), the
same comparison against `transformers serve` (with and without its --continuous-batching,
given the continuous arm's KV memory: 2048 blocks of 16 positions) at every client count
(1, 4, 16 and 64 by default) on one checkpoint in Hugging Face format that both load: the
tiny policy's shape with random weights and a 512-token BPE trained on the tiny tasks
(rlcode-hf: `rlcode serve` of the same directory, the continuous arm's flags).

With --baseline-commit C, the rlcode of an earlier commit is one more arm, rlcode-C: the
fixed-slot server that the paged engine replaced is d555ef3, its last commit. It serves
from a detached git worktree of C under --out (baseline_tree, made once and reused), run by
this environment's Python with the worktree first on its path, with the continuous arm's
flags and C's own configs/online_tiny.py, on the Hugging Face checkpoint when
--transformers is given (beside rlcode-hf) and on the tiny policy otherwise (beside
continuous). The result records C's full hash and, at each client count, today's tokens
per second over C's.

--server-cpus and --client-cpus (lists such as 0 or 0,1) pin every server's threads and
this process's clients to those CPUs; without them everything runs where it is started
(`taskset -c 0 python -m ...`: servers and clients share one core, so a server's CPU time
and the clients' compete).

Writes results/speed/<--name>/ (default serve_throughput).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import httpx

from experiments.lib import ROOT, results
from experiments.lib.trees import baseline_tree
from experiments.lib.serving import Process, start_server

CONFIG = os.path.join(ROOT, "configs", "online_tiny.py")
MODEL = "rlcode-tiny"
# The Hugging Face checkpoint's context, and the KV memory transformers-cb gets: the pages
# rlcode's continuous arm allocates by default (64 slots of the whole context in pages of 16);
# left to size its cache from free memory, it took 12 GB on a 23 GB machine and was killed.
HF_CONTEXT = 512
CB_FLAGS = ["--continuous-batching", "--cb-block-size", "16",
            "--cb-num-blocks", str(64 * HF_CONTEXT // 16)]
ARMS = {"continuous": ["--config.serve.slots=64", "--config.serve.batching=continuous"],
        "serial": ["--config.serve.slots=64", "--config.serve.batching=serial"],
        "serial-1": ["--config.serve.slots=1", "--config.serve.batching=serial"]}


async def load(url: str, clients: int, requests: int, tokens: int, model: str = MODEL) -> dict:
  """`requests` requests from `clients` concurrent clients; tokens per second."""
  todo = list(range(requests))
  counted = []

  async def client(http):
    while todo:
      i = todo.pop()
      r = await http.post("/v1/completions", json={
          "model": model, "prompt": "def f_%d(x):\n" % i, "max_tokens": tokens,
          "temperature": 1.0, "seed": i})
      r.raise_for_status()
      counted.append(r.json()["usage"]["completion_tokens"])

  async with httpx.AsyncClient(base_url=url, timeout=600,
                               limits=httpx.Limits(max_connections=clients)) as http:
    await client_warm(http, tokens, model)
    start = time.perf_counter()
    await asyncio.gather(*(client(http) for _ in range(clients)))
    seconds = time.perf_counter() - start
  return {"clients": clients, "requests": requests, "tokens": sum(counted),
          "seconds": seconds, "tokens_per_s": sum(counted) / seconds}


async def client_warm(http, tokens, model):
  """Requests first (one, then 8 at once), so no arm pays a compile or a model load inside
  its measurement."""
  ask = lambda: http.post("/v1/completions", json={"model": model, "prompt": "def warm():\n",
                                                   "max_tokens": tokens})
  (await ask()).raise_for_status()
  for r in await asyncio.gather(*(ask() for _ in range(8))):
    r.raise_for_status()


def hf_checkpoint(path: str) -> str:
  """The tiny policy's shape in Hugging Face format, random weights, with a 512-token BPE
  trained on the tiny tasks (tokenizer.json), made once."""
  if os.path.isfile(os.path.join(path, "model.safetensors")):
    return path
  from flax import nnx
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  from rlcode.models import Decoder, ModelConfig, save_hf
  with open(os.path.join(ROOT, "data", "tiny_tasks.jsonl")) as f:
    texts = [(row := json.loads(line))["prompt"] + row["reference"] for line in f]
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=512, special_tokens=["<|endoftext|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  os.makedirs(path, exist_ok=True)
  tok.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
               "pad_token": "<|endoftext|>"}, f)
  cfg = ModelConfig(vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=352,
                    num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                    rope_theta=10000.0, rms_norm_eps=1e-6, qkv_bias=True,
                    tie_embeddings=True, max_seq_len=HF_CONTEXT)
  save_hf(Decoder(cfg, rngs=nnx.Rngs(0)), path)
  return path


def start_transformers(command: str, checkpoint: str, flags, log_path: str):
  """`transformers serve CHECKPOINT` on a free loopback port; (process, URL) once healthy."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  proc = Process([command, "serve", checkpoint, "--host", "127.0.0.1", "--port", str(port),
                  "--device", "cpu", *flags], log_path)
  proc.wait_for("Uvicorn running")
  return proc, f"http://127.0.0.1:{port}"


async def redeploy(url: str, workdir: str, versions: int) -> list[float]:
  """Seconds from the end of an update (the weights in hand, before they are written) to
  the first response that carries them; each version after a random pause, so the
  server's polling is not in step with the publications."""
  import random
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
      await asyncio.sleep(random.Random(version).uniform(0.0, 0.5))
      published = time.perf_counter()
      weights.publish(os.path.join(workdir, "published"), version, params)
      while True:
        r = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                     "max_tokens": 1})
        if r.json()["policy_version"] >= version:
          out.append(time.perf_counter() - published)
          break
  return out


def pin(proc, cpus: str) -> None:
  """Every thread of a started server on `cpus` (none given: left where it is)."""
  if cpus:
    subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(proc.proc.pid)], check=True,
                   capture_output=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", default="1,4,16,64")
  parser.add_argument("--tokens", type=int, default=32)
  parser.add_argument("--versions", type=int, default=5)
  parser.add_argument("--redeploy-only", action="store_true")
  parser.add_argument("--transformers", default="",
                      help="the `transformers` command of an environment with torch")
  parser.add_argument("--baseline-commit", default="",
                      help="an earlier commit whose `rlcode serve` is one more arm")
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "out", "serve_speed"))
  parser.add_argument("--server-cpus", default="", help="CPUs every server runs on, e.g. 0")
  parser.add_argument("--client-cpus", default="", help="CPUs the clients run on, e.g. 1")
  parser.add_argument("--name", default="serve_throughput", help="the result's folder name")
  args = parser.parse_args()
  if args.client_cpus:
    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
  args.out = os.path.abspath(args.out)  # servers of another tree run from their own directory
  os.makedirs(args.out, exist_ok=True)
  levels = [int(c) for c in args.clients.split(",")]
  if args.redeploy_only:
    workdir = os.path.join(args.out, "redeploy")
    proc, url = start_server(CONFIG, [f"--config.workdir={workdir}",
                                      "--config.online.init_from=", *ARMS["continuous"]],
                             os.path.join(args.out, "redeploy.log"))
    try:
      times = asyncio.run(redeploy(url, workdir, 10))
    finally:
      proc.stop()
    print("redeploy seconds", times, "median", statistics.median(times))
    results.write("speed", args.name, {"redeploy_seconds": times,
                                                "redeploy_median_s": statistics.median(times)},
                  filename="redeploy.json")
    return
  if args.baseline_commit:
    tree = os.path.join(args.out, "baseline_tree")
    baseline_sha = baseline_tree(args.baseline_commit, tree)
    baseline = f"rlcode-{baseline_sha[:7]}"
    # The arm it is measured against: the same checkpoint and flags at HEAD.
    current = "rlcode-hf" if args.transformers else "continuous"
  table, servers = {}, {}  # arm -> (process, url, workdir, model name)
  try:
    for arm, flags in ARMS.items():
      workdir = os.path.join(args.out, arm)
      proc, url = start_server(CONFIG, [f"--config.workdir={workdir}",
                                        "--config.online.init_from=", *flags],
                               os.path.join(args.out, f"{arm}.log"))
      servers[arm] = (proc, url, workdir, MODEL)
    if args.transformers:
      checkpoint = hf_checkpoint(os.path.join(args.out, "hf_tiny"))
      proc, url = start_server(CONFIG, [f"--config.workdir={os.path.join(args.out, 'hf')}",
                                        "--config.online.init_from=",
                                        f"--config.model.hf_path={checkpoint}", *ARMS[
                                            "continuous"]], os.path.join(args.out, "hf.log"))
      servers["rlcode-hf"] = (proc, url, None, MODEL)
      for arm, flags in (("transformers", []), ("transformers-cb", CB_FLAGS)):
        proc, url = start_transformers(args.transformers, checkpoint, flags,
                                       os.path.join(args.out, f"{arm}.log"))
        servers[arm] = (proc, url, None, checkpoint)
    if args.baseline_commit:
      # A workdir per checkpoint: the interaction log refuses another model's completions.
      name = baseline + ("-hf" if args.transformers else "")
      on = [f"--config.model.hf_path={checkpoint}"] if args.transformers else []
      proc, url = start_server(os.path.join(tree, "configs", "online_tiny.py"),
                               [f"--config.workdir={os.path.join(args.out, name)}",
                                "--config.online.init_from=", *on, *ARMS["continuous"]],
                               os.path.join(args.out, f"{name}.log"), tree=tree)
      servers[baseline] = (proc, url, None, MODEL)
    for proc, *_ in servers.values():
      pin(proc, args.server_cpus)
    for c in levels:
      for arm, (_, url, _, model) in servers.items():
        row = asyncio.run(load(url, c, max(16, 2 * c), args.tokens, model))
        table.setdefault(arm, []).append(row)
        print(f"{arm:16s} clients={c:3d} {row['tokens_per_s']:8.1f} tokens/s", flush=True)
    _, url, workdir, _ = servers["continuous"]
    times = asyncio.run(redeploy(url, workdir, args.versions))
  finally:
    for proc, *_ in servers.values():
      proc.stop()
  ratio = lambda a, b, i: table[a][i]["tokens_per_s"] / table[b][i]["tokens_per_s"]
  ratios = {}
  for i, c in enumerate(levels):
    ratios[str(c)] = {"continuous/serial": ratio("continuous", "serial", i),
                      "continuous/serial-1": ratio("continuous", "serial-1", i)}
    if "transformers" in table:
      ratios[str(c)].update({"rlcode-hf/transformers": ratio("rlcode-hf", "transformers", i),
                             "rlcode-hf/transformers-cb": ratio("rlcode-hf", "transformers-cb",
                                                                i)})
    if args.baseline_commit:
      ratios[str(c)][f"{current}/{baseline}"] = ratio(current, baseline, i)
  version = (subprocess.run([args.transformers, "env"], capture_output=True, text=True).stdout
             if args.transformers else "")
  payload = {"throughput": table, "ratio": ratios, "redeploy_seconds": times,
             "redeploy_median_s": statistics.median(times), "tokens": args.tokens,
             "transformers": ([line.strip() for line in version.splitlines()
                               if "version" in line.lower()] if args.transformers
                              else "not run (no --transformers)"),
             "baseline": ({"arm": baseline, "commit": baseline_sha, "against": current}
                          if args.baseline_commit else "not run (no --baseline-commit)"),
             "python": sys.version.split()[0],
             "cpus": {"servers": args.server_cpus or "as started",
                      "clients": args.client_cpus or "as started"}}
  print(json.dumps(ratios, indent=1), "redeploy median", payload["redeploy_median_s"])
  results.write("speed", args.name, payload)


if __name__ == "__main__":
  main()
