"""What the memory features cost in time: each against the plain update, side by side.

On one machine, in one run, with one model and batch (the shared-prompt GRPO update of a
4-layer, 256-wide decoder, 8 prompts x 4 completions, prompt 192 + completion 64, float32):
best-of-N seconds of the jitted update step (forward, backward, AdamW) and their ratios:

  remat         full rematerialisation over none                      (expect ~1.3x)
  chunked       log-probs in chunks of 16 positions over the whole logits (target <= 1.1x)
  micro         4 micro-batches over 1, the same rows
  context       context parallelism 4 over 1 device, on 8 fake devices: fsdp 2 x context 4
                over fsdp 2 (the same total work, spread over twice the devices)
  lora          a LoRA rank-16 update over the full fine-tune; and the optimiser state's
                bytes, LoRA's over the full fine-tune's
  lora_decode   sampling with the adapters folded in (Decoder.for_sampling) over the
                unmerged model's low-rank matmuls every token

    python -m experiments.speed.fit_costs                 # about 5 minutes on 2 cores
    python -m experiments.speed.fit_costs --quick         # smaller, a smoke run

Writes results/speed/fit_costs[_quick]/result.json (and its manifest).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from experiments.lib import results  # noqa: E402
from experiments.lib.timing import best_time  # noqa: E402
from rlcode import optim  # noqa: E402
from rlcode.models import Decoder, ModelConfig, lora  # noqa: E402
from rlcode.parallel import sharding  # noqa: E402
from rlcode.rl import grpo, objective, shared_prefix  # noqa: E402
from rlcode.sampling import generate  # noqa: E402

FULL = dict(vocab_size=2048, hidden_size=256, intermediate_size=768, num_layers=4,
            num_heads=8, num_kv_heads=2, attn_impl="xla", max_seq_len=1024)
QUICK = dict(FULL, hidden_size=64, intermediate_size=192, vocab_size=512, num_heads=4)


def batch_of(prompts: int, group: int, prompt_len: int, completion_len: int, vocab: int):
  rng = np.random.default_rng(0)
  p = [rng.integers(1, vocab, prompt_len).tolist() for _ in range(prompts)]
  c = [rng.integers(1, vocab, completion_len).tolist() for _ in range(prompts * group)]
  old = [(-rng.random(completion_len)).astype(np.float32) for _ in c]
  adv = rng.normal(size=len(c)).astype(np.float32)
  return shared_prefix.grouped_batch(p, c, pad_id=0, completion_len=completion_len,
                                     old_logp=old, adv=adv)


def update_seconds(cfg: ModelConfig, batch, mesh_kw: dict, repeats: int,
                   micro_batch_rows: int | None = None) -> tuple[float, int]:
  """(best seconds of the update, optimiser-state bytes)."""
  mesh = sharding.make_mesh(**mesh_kw)
  model = sharding.init_sharded(lambda: Decoder(cfg, rngs=nnx.Rngs(0)), mesh)
  graphdef, _ = nnx.split(model, nnx.Param)
  trainable = lora.trainable(cfg)
  tx = optax.adamw(1e-4)
  state = optim.init_state(model, tx, mesh, trainable)
  opt_bytes = sum(x.nbytes for x in jax.tree.leaves(state.opt_state))
  loss_cfg = objective.LossConfig(max_completion_len=batch.mask.shape[1])
  update = grpo.make_update_step(graphdef, tx, loss_cfg, mesh, state, batch,
                                 logprob_fn=shared_prefix.logprob_fn(1.0),
                                 micro_batch_rows=micro_batch_rows, trainable=trainable)
  placed = jax.device_put(batch, optim.batch_shardings(mesh, batch))
  box = {"state": state}

  def step():
    box["state"], metrics = update(box["state"], placed)
    return metrics["loss"]
  return best_time(step, repeats), opt_bytes


def decode_seconds(model, repeats: int, tokens: int) -> float:
  prompts = [[5, 6, 7, 8] * 8] * 4
  return best_time(lambda: generate(model, prompts, max_new_tokens=tokens, group_size=2,
                                    seed=0).tokens, repeats)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  arch = QUICK if args.quick else FULL
  prompt_len, completion_len = (64, 32) if args.quick else (192, 64)
  batch = batch_of(8, 4, prompt_len, completion_len, arch["vocab_size"])
  base = ModelConfig(**arch)
  r = args.repeats
  seconds = {}
  seconds["plain"], full_opt = update_seconds(base, batch, {}, r)
  seconds["remat_full"], _ = update_seconds(base.replace(remat="full"), batch, {}, r)
  seconds["chunked"], _ = update_seconds(base.replace(logits_chunk=16), batch, {}, r)
  seconds["micro_4"], _ = update_seconds(base, batch, {}, r, micro_batch_rows=8)
  seconds["fsdp_2"], _ = update_seconds(base, batch, dict(fsdp=2), r)
  seconds["fsdp_2_context_4"], _ = update_seconds(base, batch, dict(fsdp=2, context=4), r)
  lora_cfg = base.replace(lora=dict(rank=16))
  seconds["lora_16"], lora_opt = update_seconds(lora_cfg, batch, {}, r)

  model = Decoder(lora_cfg, rngs=nnx.Rngs(0))
  looped = model.looped()
  looped.for_sampling = lambda: looped  # the adapters' matmuls every token
  new = 16 if args.quick else 64
  decode = {"merged": decode_seconds(model, r, new), "unmerged": decode_seconds(looped, r, new)}

  ratios = {
      "remat_full_over_none": seconds["remat_full"] / seconds["plain"],
      "chunked_over_full_logits": seconds["chunked"] / seconds["plain"],
      "micro_4_over_1": seconds["micro_4"] / seconds["plain"],
      "context_4_over_1": seconds["fsdp_2_context_4"] / seconds["fsdp_2"],
      "lora_update_over_full": seconds["lora_16"] / seconds["plain"],
      "lora_optimizer_bytes_over_full": lora_opt / full_opt,
      "merged_decode_over_unmerged": decode["merged"] / decode["unmerged"],
  }
  payload = {"arch": arch, "batch": {"prompts": 8, "group": 4, "prompt_len": prompt_len,
                                     "completion_len": completion_len},
             "seconds": seconds, "decode_seconds": decode, "ratios": ratios,
             "optimizer_bytes": {"full": full_opt, "lora_16": lora_opt}}
  for name, value in ratios.items():
    print(f"{name:34s} {value:6.3f}")
  results.write("speed", "fit_costs_quick" if args.quick else "fit_costs", payload)


if __name__ == "__main__":
  main()
