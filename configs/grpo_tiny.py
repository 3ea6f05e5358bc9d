"""GRPO on unit-test rewards with a tiny byte-level policy, on CPU.

    rlcode train --config configs/grpo_tiny.py

The policy (configs/sample_tiny.py's ~1M-parameter decoder) starts from scratch,
gets a short supervised warm start on the training split's reference solutions,
then trains with GRPO on the embedded problem set (data/tiny_tasks.jsonl: small
functions in families such as "add k", "filter a list above k", "count a
letter"), with every completion run against its tests in the bubblewrap
sandbox. Evaluation: pass@1 by the unbiased estimator over eval.num_samples samples
per problem at the rollout temperature; during training on the validation split (77
problems), the held-out split (86: new constants and names of the trained families) is
for experiments/grpo_tiny_seeds.py, once per run.

Measured (experiments/grpo_tiny_seeds.py, 3 seeds, this file unchanged, ~12 minutes a
seed on 2 quiet CPU cores): held-out pass@1 0.099 after the warm start, +0.068 ± 0.004
after 120 GRPO steps (validation +0.012 ± 0.006), short of the +0.10 target; a
cross-entropy control given the same training time gains +0.578 ± 0.055 held out (the
120-step warm start is far from converged), so GRPO here loses to more supervised
training: a miss, with the numbers in experiments/README.md ("grpo_tiny_seeds"). The
step budget was chosen on validation (flat from step 120 to 240 at this lr; lr 2e-4 no
better). An earlier +0.108 was tuned on the held-out split and is withdrawn.
"""

import ml_collections

from common import optimizer, tiny_model


def get_config():
  config = ml_collections.ConfigDict()
  config.workdir = "workdirs/grpo_tiny"
  config.seed = 0
  config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1))
  # "": sample on the trainer's devices; "tensor=4" (say): a sampler mesh of its own
  # on the devices after the trainer's (rlcode.distributed.meshes).
  config.sampler_mesh = ""
  config.model = tiny_model()

  config.data = ml_collections.ConfigDict(dict(
      source="jsonl", path="data/tiny_tasks.jsonl", data_dir="",
      train_split="train", eval_split="validation", max_eval_tasks=0))

  config.rewards = ml_collections.ConfigDict({"tests": 1.0, "format": 0.0})
  config.reward_options = ml_collections.ConfigDict({
      "tests": {"mode": "all"}, "format": {}})

  config.rl = ml_collections.ConfigDict(dict(
      group_size=8, prompts_per_step=16, temperature=1.0, top_p=1.0, top_k=0,
      max_new_tokens=40, num_passes=2, advantage="grpo", shared_prefix=True,
      loss_aggregation="seq_mean_token_mean", clip_eps_low=0.2, clip_eps_high=0.28,
      beta=0.0, log_kl=True,
      # Asynchronous rollouts (rlcode.async_rollouts): sample up to max_staleness
      # policy versions ahead of the update; 0 is the synchronous loop.
      max_staleness=0, max_importance_weight=2.0, sample_version="latest"))
  config.optimizer = optimizer(lr=3e-4, warmup=5, decay=120)

  config.warmstart = ml_collections.ConfigDict(dict(
      steps=120, batch_size=32, optimizer=optimizer(lr=3e-3, warmup=20, decay=120),
      # A directory here keeps the warm start (keyed by what it depends on) for later
      # runs with the same seed, model and data: experiment arms then share it.
      cache_dir=""))

  config.train = ml_collections.ConfigDict(dict(
      steps=120, checkpoint_every=40, eval_every=40, keep_checkpoints=2,
      on_nonfinite="skip", progress_bar=True))
  config.eval = ml_collections.ConfigDict(dict(
      num_samples=8, temperature=1.0, max_new_tokens=40, ks=(1, 8), batch_prompts=32))
  return config
