"""GRPO on reasoning-gym's procedural questions, each answer scored by its generator's own
verifier: the path from reasoning-gym to rlcode's tasks, rewards and evaluation.

    rlcode train --config configs/grpo_gym.py           # a 300-step warm start, 60 GRPO steps
    rlcode train --config configs/grpo_gym.py:smoke     # 2 GRPO steps, no warm start

The tasks (config.data.source "reasoning_gym", rlcode.data.reasoning_gym) are two easy
generators: basic_arithmetic (two terms of one or two digits, + and -) and leg_counting
(one or two kinds of animal, at most three of each); per generator 512 training
questions, 32 to tune on and 64 held out, no question in two splits. A prompt is the question and
"\\nAnswer:"; a task's reference is the answer, which the warm start trains on. The "gym"
reward (rlcode.rewards.gym) is the generator's score_answer of the completion's answer
(here the whole completion, stripped: the prompt ends with "Answer:"). Evaluation is the
reward's mean on the validation split (reward_mean, gym/correct).

The smoke run takes about a minute of CPU (3.7 minutes of wall clock on a shared, busy
core); tests/test_reasoning_gym.py runs it at a toy model size in about 30 s.

Result: none to report. The policy is the ~1M-parameter byte-level decoder from scratch;
without the warm start it writes random bytes and scores about 0 (the smoke run's reward
is 0), and the full job was not run. The job shows the path; for a real policy, set
config.model (a chat checkpoint's template asks for the answer in <answer> tags,
rlcode.data.chat_prompts) and harder generators in data.gym.
"""

import ml_collections

from common import optimizer, tiny_model


def get_config(arg: str | None = None):
  """The job; arg "smoke": 2 GRPO steps of 4 prompts x 4 samples on 8 training questions
  per generator, no warm start (tests/test_reasoning_gym.py)."""
  config = ml_collections.ConfigDict()
  config.trainer = "grpo"
  config.workdir = "workdirs/grpo_gym"
  config.model = tiny_model()
  config.data = ml_collections.ConfigDict(dict(source="reasoning_gym"))
  config.data.gym = ml_collections.ConfigDict(dict(
      datasets=("basic_arithmetic", "leg_counting"), train_size=512, validation_size=32,
      held_out_size=64, seed=0))
  config.data.gym.kwargs = ml_collections.ConfigDict(dict(
      basic_arithmetic=dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2,
                            operators=("+", "-"), allow_parentheses=False,
                            allow_negation=False),
      leg_counting=dict(min_animals=1, max_animals=2, min_instances=1, max_instances=3)))
  config.rewards = ml_collections.ConfigDict({"gym": 1.0})
  config.reward_options = ml_collections.ConfigDict({"gym": {"extract": "auto"}})
  config.rl = ml_collections.ConfigDict(dict(
      group_size=8, prompts_per_step=16, max_new_tokens=16, num_passes=2, log_kl=True))
  config.optimizer = optimizer(lr=3e-4, warmup=5)
  config.warmstart = ml_collections.ConfigDict(dict(
      steps=300, batch_size=32, optimizer=optimizer(lr=3e-3, warmup=20)))
  config.train = ml_collections.ConfigDict(dict(steps=60, checkpoint_every=20, eval_every=20))
  config.eval = ml_collections.ConfigDict(dict(num_samples=4))
  if arg == "smoke":
    config.workdir = "workdirs/grpo_gym_smoke"
    config.data.gym.update(train_size=8, validation_size=4, held_out_size=4)
    config.rl.update(group_size=4, prompts_per_step=4, max_new_tokens=8, num_passes=1)
    config.warmstart.update(steps=0)
    config.train.update(steps=2, checkpoint_every=2, eval_every=2)
    config.eval.update(num_samples=2)
  elif arg is not None:
    raise ValueError(f"configs/grpo_gym.py:{arg}: the argument is 'smoke'")
  return config
