"""GRPO on unit tests with a chat-tuned checkpoint from the Hub, through its chat template.

    rlcode train --config configs/chat_grpo.py                      # Qwen2.5-Coder-0.5B-Instruct
    rlcode train --config configs/chat_grpo.py:qwen2.5-coder-1.5b
    rlcode train --config configs/chat_grpo.py:qwen3-1.7b

Each task of the tiny families (data/tiny_tasks.jsonl: HumanEval-style function heads) is
asked as the user turn of the checkpoint's own chat template ("Complete the following
Python function..."), and the answer's python block is run against the task's tests in
the sandbox (rlcode.data.chat_prompts). No warm start: the checkpoint already answers in
code. For one GPU (80 GB) in bfloat16, each block rematerialised, log-probs in chunks.
Runs on CPU in CI for two steps with a tiny random stand-in of each family and a
tokenizer with a chat template (tests/test_chat_configs.py).

Result: not yet run on a GPU (the path is checked end to end on CPU).
"""

import ml_collections

from common import optimizer

MODELS = {"qwen2.5-coder-0.5b": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
          "qwen2.5-coder-1.5b": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
          "qwen3-1.7b": "Qwen/Qwen3-1.7B"}


def get_config(arg: str | None = None):
  """arg: one of MODELS (default qwen2.5-coder-0.5b)."""
  name = arg or "qwen2.5-coder-0.5b"
  if name not in MODELS:
    raise ValueError(f"configs/chat_grpo.py:{name}: expected one of {sorted(MODELS)}")
  config = ml_collections.ConfigDict()
  config.trainer = "grpo"
  config.workdir = f"workdirs/chat_grpo_{name}"
  config.model = ml_collections.ConfigDict(dict(
      hf_path=MODELS[name], param_dtype="bfloat16", dtype="bfloat16", remat="full",
      logits_chunk=256))
  config.data = ml_collections.ConfigDict(dict(source="jsonl", path="data/tiny_tasks.jsonl",
                                               prompt_format="chat", drop_too_long=True))
  config.rewards = ml_collections.ConfigDict({"tests": 1.0})
  config.rl = ml_collections.ConfigDict(dict(
      group_size=8, prompts_per_step=16, max_new_tokens=512, num_passes=1, log_kl=False))
  config.optimizer = optimizer(lr=1e-6, warmup=10)
  config.warmstart = ml_collections.ConfigDict(dict(steps=0))
  config.train = ml_collections.ConfigDict(dict(steps=200, checkpoint_every=50, eval_every=50))
  config.eval = ml_collections.ConfigDict(dict(num_samples=4, ks=(1, 4), max_new_tokens=512))
  return config
