"""Small jobs the CLI runs that are not training or evaluation: sampling."""

from __future__ import annotations

import json
import os
import time

import jax

from rlcode.parallel import sharding
from rlcode.models.build import build_model
from rlcode.sampling import generate


def sample(config) -> list[dict]:
  """Samples config.sampling.group_size completions for each of config.prompts.

  Writes workdir/samples.jsonl and returns its rows.
  """
  mesh = sharding.mesh_from_config(config.mesh)
  model, tokenizer = build_model(config.model, mesh, config.seed)
  prompts = [tokenizer.encode(p) for p in config.prompts]
  s = config.sampling
  kwargs = dict(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                top_k=s.top_k, group_size=s.group_size, stop_tokens=tokenizer.eos_ids,
                pad_id=tokenizer.pad_id, mesh=mesh)
  generate(model, prompts, seed=config.seed, **kwargs)  # compile once, untimed
  start = time.perf_counter()
  gen = generate(model, prompts, seed=config.seed, **kwargs)
  seconds = time.perf_counter() - start
  rows = []
  for i, completion in enumerate(gen.completions()):
    p = int(gen.prompt_index[i])
    rows.append({"prompt": config.prompts[p], "completion": tokenizer.decode(completion),
                 "tokens": completion, "logprob": float(gen.logprobs[i].sum()),
                 "finished": bool(gen.finished[i])})
  os.makedirs(config.workdir, exist_ok=True)
  path = os.path.join(config.workdir, "samples.jsonl")
  with open(path, "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  tokens = int(gen.lengths.sum())
  print(f"{len(rows)} completions, {tokens} tokens in {seconds:.2f}s "
        f"({tokens / seconds:.0f} tokens/s on {len(mesh.devices.flat)} {jax.default_backend()} "
        f"device(s)); wrote {path}")
  for row in rows[:3]:
    print(repr(row["prompt"] + row["completion"]))
  return rows
