"""The config schema: one dataclass per section, each key's type, default, allowed values
and doc in one place.

`configs/*.py` files stay ml_collections ConfigDicts (the file format and the
command-line override layer); `rlcode.config.loader` validates them against these
sections and fills every default, so library code reads `config.rl.group_size` and never
`config.get(key, default)`. `rlcode config keys` prints this file as a table;
`rlcode config show CONFIG` prints a config resolved.

The trainer is declared (`config.trainer`); `TRAINER_SECTIONS` says which top-level keys
each trainer reads, and a key marked `only=(...)` is read by those trainers only
(elsewhere it must keep its default). Derived keys default to None and are filled from
what they follow (`DERIVED`). Sections defined elsewhere (the architecture, PR mining,
section tasks, the optimiser) are the dataclasses their code constructs.
"""

from __future__ import annotations

import dataclasses

from rlcode.fields import Lazy, key
from rlcode.config.harness import Harness
from rlcode.config.policy import Mesh, Model
from rlcode.config.rl import RL
from rlcode.config.serving import Online, Serve
from rlcode.data.git.config import MiningConfig
from rlcode.data.gym_config import GymConfig
from rlcode.data.sections.tasks import SectionOptions
from rlcode.optim.adamw import OptimizerConfig
from rlcode.rewards.config import RewardOptions
from rlcode.swe.config import SweConfig

TRAINERS = ("grpo", "agent", "rm", "sample", "online", "harness")
SOURCES = ("jsonl", "humaneval", "git", "sections", "choices", "swe", "swebench",
           "verifiers", "reasoning_gym")
# The held-out splits' names across the sources ("test": git, swe, humaneval; "held_out":
# jsonl, choices). A policy loop's periodic evaluation is what a run is tuned on, so it may
# not be one of them; a held-out read is data.test_split's, or an experiment's
# (experiments.lib.heldout, which records it).
HELD_OUT_SPLITS = ("test", "held_out")


@dataclasses.dataclass(frozen=True)
class Data:
  """Where tasks (or choices) come from (rlcode.data.sources).

  Attributes:
    source: "jsonl" (a problems file, `path`), "humaneval" (the 164 problems), "git"
      (mined PRs of `repo`), "sections" (documents of `sources`), "choices" (user
      choices among candidates, `path`; the reward model's data), "swe" (executable PR
      tasks mined from `repo`), "swebench" (executable PR tasks from a SWE-bench
      JSON-lines file, `path`), "verifiers" (the rows of the harness trainer's
      harness.verifiers environment) or "reasoning_gym" (questions of reasoning-gym's
      generators, `gym`).
    path: the JSON-lines file of "jsonl", "choices" and "swebench".
    repo: the repository or bundle "git" and "swe" mine, or a tuple of them mined alike;
      "swebench": the history its instances' files are read from (None: the history
      each instance names).
    data_dir: where prepared datasets are cached; None: $TFDS_DATA_DIR, else
      ~/.cache/rlcode/tfds.
    train_split: the split trained on.
    eval_split: the split evaluated during training (the one to tune on); never a held-out
      split (HELD_OUT_SPLITS), but for "choices": a reward model's held-out accuracy curve
      (experiments/rm/saturation.py) is its loop's evaluation.
    test_split: a held-out split also evaluated at the first and the last evaluation;
      None while tuning.
    max_eval_tasks: evaluate only the first this many tasks (by id); None: all.
    drop_too_long: drop and count the tasks that do not fit the context (else an error).
    mining: how "git" mines PRs into tasks (rlcode.data.git.MiningConfig; its source is
      `repo`); None: its defaults.
    swe: how "swe" mines executable PR tasks (rlcode.swe.config.SweConfig; its source is
      `repo`); None: its defaults.
    gym: "reasoning_gym": which generators make the tasks, how many and from what seed
      (rlcode.data.gym_config.GymConfig); required for that source.
    sources: "sections": documents (files, directories, gs:// paths); () the embedded corpus.
    count_tokens: "sections": the unit of the budgets, "words", "bytes" or a tokenizer.json.
    prompt_format: code and gym tasks asked through the tokenizer's chat template ("chat"), as
      bare prompts ("plain"), or the template when there is one ("auto";
      rlcode.data.chat_prompts).
    options: "sections": how documents become tasks (rlcode.data.sections.SectionOptions);
      None: its defaults.
    held_out_fraction: "choices": the fraction of tasks whose choices are held out.
    max_train_choices: "choices": train on a seeded subset of this many; None: all.
    subset_seed: "choices": the seed of that subset.
    reference_share: the share of the training split's tasks with tests that keep their
      reference solution (chosen by a hash of the task id: the same tasks in every run);
      the others have tests and no reference, as most real functions do. Supervised training (a
      warm start, a cross-entropy control) uses the references; RL from tests trains on
      every task.
  """

  source: str = key("jsonl", choices=SOURCES)
  path: str | None = key(None)
  repo: str | tuple[str, ...] | None = key(None)
  data_dir: str | None = key(None)
  train_split: str = key("train")
  eval_split: str = key("validation")
  test_split: str | None = key(None)
  max_eval_tasks: int | None = key(None, ge=1)
  drop_too_long: bool = key(False)
  mining: MiningConfig | None = key(None)
  swe: SweConfig | None = key(None)
  gym: GymConfig | None = key(None)
  sources: tuple[str, ...] = key(())
  count_tokens: str = key("words")
  prompt_format: str = key("auto", choices=("auto", "chat", "plain"))
  options: SectionOptions | None = key(None)
  held_out_fraction: float = key(0.2, ge=0, le=1, only=("rm",))
  max_train_choices: int | None = key(None, ge=1, only=("rm",))
  subset_seed: int = key(0, only=("rm",))
  reference_share: float = key(1.0, gt=0, le=1)

  def __post_init__(self):
    need = {"jsonl": "path", "choices": "path", "git": "repo", "swe": "repo",
            "swebench": "path", "reasoning_gym": "gym"}.get(self.source)
    if need and not getattr(self, need):
      raise ValueError(f"data.{need} must be set for source {self.source!r}")
    if self.mining is not None and self.source != "git":
      raise ValueError(f"data.mining is for source 'git', not {self.source!r}")
    if self.swe is not None and self.source != "swe":
      raise ValueError(f"data.swe is for source 'swe', not {self.source!r}")
    if self.gym is not None and self.source != "reasoning_gym":
      raise ValueError(f"data.gym is for source 'reasoning_gym', not {self.source!r}")
    if self.options is not None and self.source != "sections":
      raise ValueError(f"data.options is for source 'sections', not {self.source!r}")
    if self.eval_split in HELD_OUT_SPLITS and self.source != "choices":
      raise ValueError(f"eval_split={self.eval_split!r} is a held-out split: a training "
                       "loop evaluates on a split to tune on (validation); read a held-out "
                       "one through data.test_split")


@dataclasses.dataclass(frozen=True)
class WarmStart:
  """The supervised warm start before GRPO (rlcode.policy.warm_start, rlcode.agent.demos;
  the agent's demonstrator is config.agent's).

  Attributes:
    steps: supervised steps on the training split's references (agent: demonstrations);
      0: none.
    batch_size: rows per step.
    optimizer: its optimiser (decay_steps derived from warmstart.steps).
    cache_dir: keep the warm start there under a hash of what it depends on, and load it
      in any later run with the same hash; None: no cache.
    seed: the seed of the warm start's initial weights and batch order, so runs of several
      seeds share one warm start; None: the run's seed.
    data: another data section whose train split the warm start also reads (practice
      data); None: none.
    train_repeats: how many times each training task is in the warm start's list.
    bucket: batch rows of like lengths in pools of this many batches (rlcode.policy.sft).
    renumber: show each line-edit row's file with up to this many more lines on top.
    ema: return a moving average of the params with this decay; 0: the last params.
  """

  steps: int = key(0, ge=0)
  batch_size: int = key(16, ge=1)
  optimizer: OptimizerConfig = key({"learning_rate": 3e-3, "warmup_steps": 10})
  cache_dir: str | None = key(None)
  seed: int | None = key(None)
  data: Data | None = key(None, only=("grpo",))
  train_repeats: int = key(1, ge=1, only=("grpo",))
  bucket: int = key(1, ge=1, only=("grpo",))
  renumber: int = key(0, ge=0, only=("grpo",))
  ema: float = key(0.0, ge=0, lt=1, only=("grpo",))


@dataclasses.dataclass(frozen=True)
class Train:
  """The loop's length and cadences (rlcode.train.scaffold).

  Attributes:
    steps: training steps (updates).
    checkpoint_every: save a checkpoint every this many steps (and at the end).
    eval_every: evaluate every this many steps (and at the start and the end); 0: never.
    eval_steps: further steps to evaluate at.
    keep_checkpoints: how many checkpoints are kept.
    on_nonfinite: a step whose loss or gradient is not finite: "skip" it (counted) or
      "stop" the run.
    progress_bar: draw a progress bar.
  """

  steps: int = key(100, ge=0)
  checkpoint_every: int = key(100, ge=1)
  eval_every: int = key(0, ge=0)
  eval_steps: tuple[int, ...] = key((), ge=1)
  keep_checkpoints: int = key(2, ge=1)
  on_nonfinite: str = key("skip", choices=("skip", "stop"))
  progress_bar: bool = key(True)


@dataclasses.dataclass(frozen=True)
class Eval:
  """Evaluation during training and of checkpoints (rlcode.policy.policy_eval).

  Attributes:
    num_samples: samples (agent: episodes) per task.
    temperature: their sampling temperature.
    max_new_tokens: the completion budget; None: rl.max_new_tokens.
    ks: the k of pass@k (each at most num_samples).
    batch_prompts: tasks sampled at a time.
  """

  num_samples: int = key(8, ge=1)
  temperature: float = key(1.0, ge=0)
  max_new_tokens: int | None = key(None, ge=1, only=("grpo",),
                                   derived="rl.max_new_tokens")
  ks: tuple[int, ...] = key((1,), ge=1, only=("grpo",))
  batch_prompts: int = key(32, ge=1)


@dataclasses.dataclass(frozen=True)
class Agent:
  """Multi-turn tool use (rlcode.agent).

  Attributes:
    tools: the episode's tools (rlcode.agent.tools), "finish" among them.
    chat_format: "template" (the checkpoint's chat template), "compact" (our tiny
      tokenizers'), "hermes" (Qwen-style tags written by hand), or "auto": the template
      when the tokenizer has one, else compact (rlcode.agent.chat).
    toolset: the expert's tool set: "rich" (editor, search, run_tests) or "terminal" (bash).
    think: the expert's thinking: "none", "start" (a plan first) or "each" (after each call).
    demo_tasks: the warm start demonstrates only the first this many training tasks;
      None: all.
    guess_fraction: the fraction of tasks whose demonstration does not look (guesses).
    guess_families: the families such demonstrations may come from; (): every family.
    decoy_copy: the fraction of tasks with a decoy line whose demonstration copies it.
    note_trust: the fraction of tasks with a stale note whose demonstration believes it.
    variants: the task families kept (by the tasks' family); (): all.
    max_turns: tool calls per episode.
    max_total_tokens: an episode's token budget (prompt excluded).
    max_turn_tokens: a turn's sampling budget.
    max_observation_tokens: an observation is cut to this many tokens.
    max_observation_bytes: an observation is first cut to this many bytes of UTF-8 (before
      it is tokenised).
    mask_cut: an episode cut by a budget or timeout is out of the loss whole.
    success_reward: the final reward that counts as success.
    memory_rule: what the memory tool keeps across episodes (rlcode.agent.memory).
    semantic_search: the search tool ranks by MiniLM embeddings.
    bash_seconds: a bash command's wall clock.
    episode_seconds: an episode's wall clock.
    workers: environments stepped in parallel.
  """

  tools: tuple[str, ...] = key(("editor", "search", "run_tests", "finish"),
                               choices=Lazy("rlcode.agent.tools", "TOOLS"),
                               check=lambda t: "finish" in t, allowed="with 'finish'")
  chat_format: str = key("auto", choices=("auto", "compact", "hermes", "template"))
  toolset: str = key("rich", choices=("rich", "terminal"))
  think: str = key("none", choices=("none", "start", "each"))
  demo_tasks: int | None = key(None, ge=1)
  guess_fraction: float = key(0.0, ge=0, le=1)
  guess_families: tuple[str, ...] = key((), choices=("file", "search", "tests"))
  decoy_copy: float = key(0.0, ge=0, le=1)
  note_trust: float = key(0.0, ge=0, le=1)
  variants: tuple[str, ...] = key(())
  max_turns: int = key(5, ge=1)
  max_total_tokens: int = key(640, ge=1)
  max_turn_tokens: int = key(160, ge=1)
  max_observation_tokens: int = key(96, ge=32)
  max_observation_bytes: int = key(16384, ge=256)
  mask_cut: bool = key(True)
  success_reward: float = key(1.0)
  memory_rule: str = key("dedupe", choices=Lazy("rlcode.agent.memory", "RULES"))
  semantic_search: bool = key(False)
  bash_seconds: float = key(5.0, gt=0)
  episode_seconds: float = key(120.0, gt=0)
  workers: int = key(8, ge=1)


@dataclasses.dataclass(frozen=True)
class RM:
  """The reward model on choices (rlcode.rm).

  Attributes:
    pooling: the hidden state scored: "last" (the candidate's last token) or "mean".
    head_hidden: the scalar head's hidden width.
    features: ground-truth inputs beside the text (rlcode.rm.features).
    init_from: a policy's workdir or checkpoint to start the backbone from; None: scratch.
    batch_choices: choices per step.
    max_candidates: the most candidates a choice may have; None: the data's most.
  """

  pooling: str = key("last", choices=("last", "mean"))
  head_hidden: int = key(64, ge=1)
  features: tuple[str, ...] = key((), choices=("tests_fraction", "passed", "similarity",
                                               "length"))
  init_from: str | None = key(None)
  batch_choices: int = key(16, ge=1)
  max_candidates: int | None = key(None, ge=1)


@dataclasses.dataclass(frozen=True)
class Sampling:
  """`rlcode sample`'s sampling (rlcode.sampling.job).

  Attributes:
    max_new_tokens: the completion budget.
    temperature: 0 is greedy.
    top_p: nucleus sampling; 1 turns it off.
    top_k: top-k sampling; 0 turns it off.
    group_size: completions per prompt.
  """

  max_new_tokens: int = key(64, ge=1)
  temperature: float = key(1.0, ge=0)
  top_p: float = key(1.0, gt=0, le=1)
  top_k: int = key(0, ge=0)
  group_size: int = key(1, ge=1)


@dataclasses.dataclass(frozen=True)
class Plan:
  """`rlcode plan`'s shapes beyond the config's (rlcode.plan).

  Attributes:
    prompt_len: prompt tokens of the planned batch.
  """

  prompt_len: int = key(256, ge=1)


@dataclasses.dataclass(frozen=True)
class Logging:
  """Metrics writers beside metrics.jsonl, which is always written (rlcode.runs.metrics).

  Attributes:
    tensorboard: TensorBoard events under workdir/tensorboard.
    wandb: Weights & Biases (the `wandb` extra).
    wandb_project: the W&B project.
    wandb_entity: the W&B entity (team or user); None: the default one.
    wandb_mode: "offline" (files under workdir/wandb, no network; `wandb sync` later) or
      "online".
  """

  tensorboard: bool = key(True)
  wandb: bool = key(False)
  wandb_project: str = key("rlcode")
  wandb_entity: str | None = key(None)
  wandb_mode: str = key("offline", choices=("offline", "online"))


@dataclasses.dataclass(frozen=True)
class Config:
  """A run: what trains, on what, for how long, where it writes.

  Attributes:
    trainer: what `rlcode train` runs: "grpo" (GRPO on single-turn tasks), "agent" (GRPO
      over tool-use episodes), "rm" (a reward model on choices), "sample" (`rlcode
      sample`), "online" (`rlcode serve` and `rlcode learn-online`) or "harness" (GRPO whose
      rollouts are an outside harness's episodes through the OpenAI API).
    workdir: where the run writes metrics, checkpoints and its config; local, as its
      metrics and config are written with local file calls.
    seed: every random draw derives from it.
    mesh: the trainer's device mesh.
    sampler_mesh: the sampler's own mesh on the devices after the trainer's (e.g.
      "data=2,tensor=2"); None: the trainer's devices.
    model: the policy.
    data: the tasks (choices for "rm").
    rewards: reward name -> weight (rlcode.rewards registry).
    reward_options: each reward's options, under its name.
    rl: GRPO's settings.
    optimizer: the optimiser (decay_steps derived from train.steps).
    warmstart: the supervised warm start.
    train: the loop's length and cadences.
    eval: evaluation.
    agent: tool use.
    rm: the reward model.
    sampling: `rlcode sample`'s sampling.
    prompts: `rlcode sample`'s prompts.
    plan: `rlcode plan`'s shapes.
    serve: `rlcode serve`'s server (and the harness trainer's, in its process).
    online: `rlcode learn-online`'s learner.
    harness: the harness trainer's harness, its reward and how its episodes run.
    logging: metrics writers.
  """

  trainer: str = key(choices=TRAINERS)
  workdir: str = key(check=lambda w: "://" not in w, allowed="a local directory")
  seed: int = key(0)
  mesh: Mesh = key({})
  sampler_mesh: str | None = key(None)
  model: Model = key({})
  data: Data = key({})
  rewards: dict[str, float] = key({}, check=lambda r: bool(r), allowed="at least one reward")
  reward_options: RewardOptions = key({})
  rl: RL = key({})
  optimizer: OptimizerConfig = key({})
  warmstart: WarmStart = key({})
  train: Train = key({})
  eval: Eval = key({})
  agent: Agent = key({})
  rm: RM = key({})
  sampling: Sampling = key({})
  prompts: tuple[str, ...] = key((), check=lambda p: bool(p), allowed="at least one prompt")
  plan: Plan = key({})
  serve: Serve = key({})
  online: Online = key({})
  harness: Harness = key({})
  logging: Logging = key({})


_COMMON = ("trainer", "workdir", "seed", "mesh", "model", "logging")
TRAINER_SECTIONS = {
    "grpo": _COMMON + ("sampler_mesh", "data", "rewards", "reward_options", "rl", "optimizer",
                       "warmstart", "train", "eval", "plan"),
    "agent": _COMMON + ("data", "rewards", "reward_options", "rl", "optimizer", "warmstart",
                        "train", "eval", "agent"),
    "rm": _COMMON + ("data", "rm", "optimizer", "train"),
    "sample": _COMMON + ("sampling", "prompts", "serve"),
    "online": _COMMON + ("data", "rl", "optimizer", "train", "serve", "online"),
    "harness": _COMMON + ("data", "rl", "optimizer", "train", "serve", "harness"),
}

# Derived keys: (key, the key it follows, the trainers it is derived for).
DERIVED = (
    ("optimizer.decay_steps", "train.steps", TRAINERS),
    ("warmstart.optimizer.decay_steps", "warmstart.steps", TRAINERS),
    ("eval.max_new_tokens", "rl.max_new_tokens", ("grpo",)),
)
