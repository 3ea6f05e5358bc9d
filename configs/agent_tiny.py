"""GRPO over multi-turn tool-use episodes with a tiny policy, on CPU.

    rlcode train --config configs/agent_tiny.py

The policy (configs/common.py's decoder with 4 KV heads, 1.33M parameters with the code
BPE's 4096 tokens plus the four tool-calling tags, "data/code_bpe.json+tools") starts from
scratch, gets a supervised warm start on scripted episodes of the training tasks
(rlcode.agent.expert), then trains with GRPO on whole trajectories: G episodes per task,
each in its own sandbox session, the final reward the task's tests on the workspace's
solution.py. The tasks (data/agent_tasks_notes.jsonl) can only be solved through the
tools: the constant is in a workspace file (named or to be searched for), or the
function's name is only in the output of the first failing test run. Each real task's
prompt also ends with a stale note (a wrong constant or name).

The demonstrations are a weaker agent's: on about 70% of the real tasks it believes the
note and writes solution.py at once (and fails), on the rest it looks as the expert does; the
practice tasks are all the expert's. Imitation learns that mix; the reward tells looking
from believing, and GRPO (on the real tasks only) learns to look. With a perfect expert
for every task, imitation leaves GRPO nothing to learn in this budget: the plain tasks'
figures and every arm tried on them are in experiments/README.md (agent_tiny).

Evaluation rows report eval/success, eval/tool_calls_per_episode and eval/note/believed
on the validation split (used for tuning); the held-out split is reported once
(experiments/agent_tiny_seeds.py).

Expected result: see experiments/README.md (agent_tiny, "a demonstrator that believes a
stale note").
"""

import ml_collections

from common import optimizer, tiny_model

TOOLS = ("editor", "search", "run_tests", "finish")


def get_config():
  config = ml_collections.ConfigDict()
  config.workdir = "workdirs/agent_tiny"
  config.seed = 0
  config.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1))
  config.model = tiny_model()
  # The code BPE rather than bytes: an episode is ~2.4x fewer tokens, so a warm-start step
  # costs 0.84 s instead of 1.5 s, and a name is copied as 2-4 tokens instead of 5-10
  # bytes. Teacher-forced on the validation episodes, the greedy policy reproduces the
  # expert in 91.1% of them after the 600 warm-start steps below (bytes: 3.6% at best,
  # on earlier practice data; experiments/agent_warm_start.py, experiments/README.md).
  config.model.tokenizer = "data/code_bpe.json+tools"
  config.model.arch.vocab_size = 4100
  config.model.arch.max_seq_len = 640
  # Four KV heads, one per query head (the shared tiny model groups 4 query heads on 2).
  # With 2, copying from the tools' output appeared by warm-start step 600 in one seed of
  # three (held-out success after the warm start 0.719, 0.066, 0.372); with 4, in all
  # three (0.708, 0.535, 0.542). A warm-start step costs ~11% more (experiments/README.md,
  # agent_tiny). That was one machine's arithmetic: on another CPU (AMD EPYC, 2026-12-03)
  # seeds 1 and 2 had not finished copying by step 600 (validation 0.080 and 0.375;
  # seed 0 0.710 on both).
  config.model.arch.num_kv_heads = 4

  config.data = ml_collections.ConfigDict(dict(
      source="jsonl", path="data/agent_tasks_notes.jsonl", data_dir="",
      train_split="train", eval_split="validation", max_eval_tasks=0))

  config.rewards = ml_collections.ConfigDict({"tests": 1.0})
  config.reward_options = ml_collections.ConfigDict({"tests": {"mode": "all"}})

  config.agent = ml_collections.ConfigDict(dict(
      tools=TOOLS, chat_format="compact", toolset="rich", think="none", variants=(),
      max_turns=5, max_total_tokens=640, max_turn_tokens=160, max_observation_tokens=96,
      mask_cut=True, success_reward=1.0, memory_rule="dedupe",
      semantic_search=False, bash_seconds=5.0, episode_seconds=120.0, workers=8))

  config.rl = ml_collections.ConfigDict(dict(
      group_size=8, prompts_per_step=8, temperature=1.0, top_p=1.0, top_k=0,
      num_passes=1, advantage="grpo", loss_aggregation="seq_mean_token_mean",
      # The weight of negative advantages (rlcode.grpo.group_advantages): 1.0 is GRPO as
      # published, 0.0 reinforces only the samples above their group's mean.
      negative_weight=1.0,
      clip_eps_low=0.2, clip_eps_high=0.28, beta=0.0, log_kl=False,
      # > 0: that many of each group's G slots hold the task's expert episode instead
      # of a sample (expert-guided groups, rlcode.agent.train; the samples they replace
      # are drawn and dropped).
      expert_slots=0,
      # A regular expression: training tasks whose id matches it are left out of GRPO's
      # stream (the warm start still uses them), e.g. "^agent/practice/".
      # The practice tasks carry no note (nothing to learn there): GRPO on the real ones.
      exclude_task_ids="^agent/practice/",
      # > 1: DAPO's dynamic sampling, capped: up to that many rounds of prompts_per_step
      # tasks a step, keeping the groups whose rewards differ until prompts_per_step are
      # kept (rlcode.agent.train.fill_with_signal); 1: every sampled group is trained.
      sample_rounds=1,
      # The update runs only the groups whose rewards differ, with the loss and gradient
      # of the whole batch (rlcode.shared_prefix.drop_idle_groups); False: every group.
      drop_idle_groups=True,
      # "signal": tasks drawn by family, weighted by the share of each family's recent
      # groups whose rewards differed (rlcode.curriculum); "": the plain seeded stream.
      # 30 steps, validation: +0.064 ± 0.024 against the plain stream's +0.045 ± 0.014,
      # +0.019 ± 0.012 paired over 3 seeds, not established (experiments/README.md).
      curriculum="", curriculum_decay=0.8, curriculum_floor=0.05))
  # lr 3e-4, as the decoy arm chose on seed 0's validation (0.473 at step 30 against
  # 0.366 at 1e-4). Its price: malformed calls rise (experiments/README.md, agent_tiny).
  config.optimizer = optimizer(lr=3e-4, warmup=5, decay=100)

  # The cosine runs over 1000 steps but the warm start stops at 900: the rate must stay
  # high while the policy learns to copy from its tools' output (between steps 400 and
  # 600 here). With the cosine over 600 the rate has fallen by then and, on these
  # practice names, copying did not appear (validation success 0.062 after 600 steps,
  # against 0.70 teacher-forced with the longer cosine; experiments/README.md).
  config.warmstart = ml_collections.ConfigDict(dict(
      # 900 steps, not 600: with the notes, seed 0's warm start had not learnt to copy
      # by step 600 on this machine (loss 0.043, validation 0.054); by 900 its loss
      # was 0.009 (3 seeds: 0.009-0.017), and its looks copied on some of the tasks.
      steps=900, batch_size=16, optimizer=optimizer(lr=3e-3, warmup=20, decay=1000),
      max_episodes=0,  # > 0: expert episodes of only the first that many training tasks
      # The fraction of training tasks whose episode is a demonstrator's that does not
      # look (rlcode.agent.expert.guess_calls) instead of the expert's.
      guess_fraction=0.0,
      # The families whose tasks may get such a demonstrator (empty: every family).
      guess_families=(),
      # With data/agent_tasks_decoy.jsonl (the file and search tasks' symbol's old value
      # commented out beside the live one): the fraction of the tasks with such a decoy
      # line whose episode copies the decoy (rlcode.agent.expert.copies_decoy); 0.5 is a
      # demonstrator that does not tell the two lines apart. With it, GRPO on the real
      # tasks at lr 3e-4 gained more held out than here, and still missed +0.15 in 30
      # and in 50 steps (experiments/README.md, agent_tiny, "decoy lines").
      decoy_copy=0.0,
      # With data/agent_tasks_notes.jsonl (every real task's prompt ends with a stale
      # note, a wrong constant or name): the fraction of the tasks with a note whose
      # episode believes it, writing solution.py at once without a look
      # (rlcode.agent.expert.trusts_note, note_calls).
      note_trust=0.7))

  # 30 GRPO steps (9-11 s each) after the ~10-minute warm start, three validation rows
  # included: 15.7-16.2 minutes a seed on 2 cores (experiments/README.md, agent_tiny).
  config.train = ml_collections.ConfigDict(dict(
      steps=30, checkpoint_every=15, eval_every=15, keep_checkpoints=2,
      on_nonfinite="skip", progress_bar=True))
  config.eval = ml_collections.ConfigDict(dict(
      num_samples=4, temperature=1.0, batch_prompts=16))
  return config
