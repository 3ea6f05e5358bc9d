"""The default job: does RL from tests improve a policy beyond what supervised training on
the same data reaches? GRPO on unit-test rewards against more supervised training, on CPU.

    rlcode train --config configs/grpo_tiny.py            # make run
    rlcode train --config configs/grpo_tiny.py:smoke      # make smoke: the same path, ~100 s
    python -m experiments.grpo.tiny_seeds --seeds 0 1 2   # both arms, held out once

data/tiny_tasks.jsonl, as real code comes: every training function has tests, half of them
(data.reference_share, by a hash of the id) a reference solution. A ~1M-parameter
byte-level decoder from scratch is warm-started on those references to its validation
plateau (1000 steps; experiments.grpo.plateau), then trained by GRPO on the tests of all
264 training tasks (90 steps, 16 prompts x 8 samples, the prompt computed once per group;
pass@1 on the 77 validation problems every 30 steps). The control continues the
supervised training on every reference for the same training time.

Result (3 seeds, docs/results.md): held-out pass@1 0.488 after the warm start, 0.555 after
GRPO (+0.067 ± 0.009), 0.492 for the control (GRPO minus control +0.063 ± 0.006); the run
takes 13-14 minutes on 2 quiet CPU cores (12:53 and 14:14 timed).
"""

import ml_collections

from common import optimizer, tiny_model


def get_config(arg: str | None = None):
  """The default job; arg "smoke": a run of the same path in about 100 s (a 100-step warm
  start, 3 GRPO steps of 8 prompts x 8 samples, pass@1 on 16 validation problems);
  "references": the default job before 2026-12-05 (every reference, a 120-step warm
  start, 120 GRPO steps), which the reward-model, online and LoRA results start from."""
  config = ml_collections.ConfigDict()
  config.trainer = "grpo"
  config.workdir = "workdirs/grpo_tiny"
  config.model = tiny_model()
  config.data = ml_collections.ConfigDict(dict(source="jsonl", path="data/tiny_tasks.jsonl",
                                               reference_share=0.5))
  config.rewards = ml_collections.ConfigDict({"tests": 1.0, "format": 0.0})
  config.reward_options = ml_collections.ConfigDict({"tests": {"mode": "all"}})
  config.rl = ml_collections.ConfigDict(dict(
      group_size=8, prompts_per_step=16, max_new_tokens=40, num_passes=2, log_kl=True))
  config.optimizer = optimizer(lr=3e-4, warmup=5)
  config.warmstart = ml_collections.ConfigDict(dict(
      steps=1000, batch_size=32, optimizer=optimizer(lr=3e-3, warmup=20)))
  config.train = ml_collections.ConfigDict(dict(steps=90, checkpoint_every=30, eval_every=30))
  config.eval = ml_collections.ConfigDict(dict(num_samples=8, ks=(1, 8)))
  if arg == "smoke":
    config.workdir = "workdirs/smoke"
    config.data.max_eval_tasks = 16
    config.rl.update(prompts_per_step=8, group_size=8)
    config.warmstart.update(steps=100)
    config.train.update(steps=3, checkpoint_every=3, eval_every=3)
    config.eval.update(num_samples=2, ks=(1, 2))
  elif arg == "references":
    config.data.reference_share = 1.0
    config.warmstart.update(steps=120)
    config.train.update(steps=120, checkpoint_every=40, eval_every=40)
  elif arg is not None:
    raise ValueError(f"configs/grpo_tiny.py:{arg}: the arguments are 'smoke' and 'references'")
  return config
