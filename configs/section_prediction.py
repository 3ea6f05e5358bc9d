"""GRPO on whole-section prediction with a semantic-similarity reward, on CPU.

    rlcode train --config configs/section_prediction.py

Data: the embedded corpus (rlcode.data.sections: the pydoc topics and the fixed
stdlib selection of the running Python), split into sections; a task's prompt
is the document title, the preceding sections and the next heading, its
reference the next section's body. The policy is the ~1M-parameter byte-level
decoder of configs/common.py, so budgets are in UTF-8 bytes
(`data.count_tokens="bytes"`): the builder trims the context from the front to
`context_budget` bytes (title line + context + heading), so every prompt is at
most 256 tokens with the BOS, and skips targets over `max_target_tokens` bytes.
Both are counted by the builder (its `over_budget` and `targets_too_long`
counts, README.md "Data"; `task.extra["context_truncated"]` marks trimmed
prompts); no prompt is dropped later: 256 prompt + 256 new tokens fit the
model's 512-token context, and generate() raises if a prompt ever did not.
At these budgets most tasks are short top-level Python definitions (a
signature as the heading, the body as the target), since few documentation
sections fit in 255 bytes; 30% of the documents are held out (by hash) so the
test split has enough tasks.

Training: a supervised warm start on the training split's reference sections
(prompt -> reference + EOS), then GRPO with 8 samples per prompt and the
semantic reward alone (cosine of MiniLM embeddings, rlcode/rewards/semantic.py).
Each step logs `reward/semantic/group_std` (the reward's spread within groups),
`reward/semantic/cosine_lexical_corr` (semantic vs chrF over the step's
samples) and the other reward metrics; held-out evaluation (2 samples per
test task) logs the same metrics under `eval/`.

Expected result (measured once, seed 0, with this file unchanged but the
workdir, as the GRPO arm of experiments/section_vs_token.py on 2 CPU cores
shared with other jobs; see experiments/README.md "section_vs_token"):
195 train / 32 test tasks; the warm start takes the reference cross-entropy
from 5.62 to 2.97 nats per byte; held-out semantic similarity (2 samples per
task at temperature 1) is 0.120 after the warm start, 0.139 at step 10 and
0.141 at step 20, chrF 9.2 throughout. Over the 20 steps
`reward/semantic/group_std` is 0.046-0.074 (mean 0.059) and
`reward/semantic/cosine_lexical_corr` -0.28 to 0.55 (mean 0.19). The steps
take 290 s of sampling + reward + update (the reward's encoder ~5 s a step,
the largest part), the whole run 470 s. One seed and 64 held-out samples:
the per-sample spread is 0.08, so the +0.02 is about two standard errors
of a 64-sample mean, not a firm gain.
"""

import ml_collections

from common import optimizer, tiny_model

STEPS = 20


def get_config():
  config = ml_collections.ConfigDict()
  config.workdir = "workdirs/section_prediction"
  config.seed = 0
  config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1))
  config.model = tiny_model()
  config.model.tokenizer = "data/code_bpe.json"
  config.model.arch.vocab_size = 4096

  config.data = ml_collections.ConfigDict(dict(
      source="sections", sources=(), data_dir="", count_tokens="data/code_bpe.json",
      options=dict(context_budget=255, max_target_tokens=255, min_target_chars=20,
                   min_block_chars=200, held_out_fraction=0.2, validation_fraction=0.2),
      train_split="train", eval_split="validation", test_split="", max_eval_tasks=64))

  config.rewards = ml_collections.ConfigDict({"semantic": 1.0})
  # No group_size: groups are runs of a task id, right for both rollouts (G=8)
  # and evaluation (eval.num_samples per task).
  config.reward_options = ml_collections.ConfigDict({
      "semantic": {"lexical_weight": 0.0, "length_penalty": 0.0}})

  config.rl = ml_collections.ConfigDict(dict(
      group_size=8, prompts_per_step=4, temperature=1.0, top_p=1.0, top_k=0,
      max_new_tokens=256, num_passes=1, advantage="grpo", shared_prefix=True,
      loss_aggregation="seq_mean_token_mean", clip_eps_low=0.2, clip_eps_high=0.28,
      beta=0.0))
  config.optimizer = optimizer(lr=3e-4, warmup=5, decay=STEPS)

  config.warmstart = ml_collections.ConfigDict(dict(
      steps=40, batch_size=16, cache_dir="", optimizer=optimizer(lr=3e-3, warmup=10, decay=40)))

  config.train = ml_collections.ConfigDict(dict(
      steps=STEPS, checkpoint_every=10, eval_every=10, keep_checkpoints=2,
      on_nonfinite="skip", progress_bar=True))
  config.eval = ml_collections.ConfigDict(dict(
      num_samples=2, temperature=1.0, max_new_tokens=256, ks=(1,), batch_prompts=32))
  return config
