"""Each family's tiny checkpoint against transformers' stored outputs: the figures of
docs/results.md, "Model families: parity with transformers".

For every case under tests/data/hf (made by tests/data/hf/make_refs.py): the largest
absolute difference of rlcode's float32 logits from transformers' over 2 x 16 tokens, and
whether 12 greedy tokens are the same.

    python -m experiments.models.parity          # about 2 minutes on 2 cores

Writes results/models/parity/result.json.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np

from experiments.lib import ROOT, results
from rlcode.models import load_hf
from rlcode.sampling import generate

CASES = os.path.join(ROOT, "tests", "data", "hf")


def main() -> None:
  rows = []
  for case in sorted(os.listdir(CASES)):
    path = os.path.join(CASES, case)
    if not os.path.isdir(path):
      continue
    with open(os.path.join(path, "refs.json")) as f:
      refs = json.load(f)
    with open(os.path.join(path, "config.json")) as f:
      hf_config = json.load(f)
    model, cfg = load_hf(path, param_dtype="float32", dtype="float32")
    logits = np.asarray(model(jnp.asarray(refs["input_ids"], jnp.int32)))
    prompt = refs["greedy_prompt"][0]
    out = generate(model, [prompt], max_new_tokens=12, temperature=0.0)
    row = dict(case=case, architecture=hf_config["architectures"][0],
               dtype=hf_config["dtype"], parameters=cfg.num_params(),
               max_abs_logit_diff=float(np.abs(logits - np.asarray(refs["logits"])).max()),
               greedy_equal=prompt + out.tokens[0].tolist() == refs["greedy_output"][0])
    rows.append(row)
    print(json.dumps(row), flush=True)
  print(f"wrote {results.write('models', 'parity', {'rows': rows})}")


if __name__ == "__main__":
  main()
