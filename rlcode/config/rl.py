"""The config schema's `rl` section: GRPO's sampling, objective, corrections and
asynchrony; rlcode.config.schema composes it into the Config."""

from __future__ import annotations

import dataclasses

from rlcode.fields import key


@dataclasses.dataclass(frozen=True)
class RL:
  """GRPO: sampling, advantages, the objective, corrections, asynchrony (rlcode.rl).

  Attributes:
    group_size: completions sampled per prompt (G).
    prompts_per_step: prompts (groups) per step.
    temperature: the sampling temperature, also applied in the update's log-probs.
    max_new_tokens: the completion budget.
    num_passes: updates per batch.
    micro_batch_rows: accumulate the update's gradient over micro-batches of this many
      rows (whole groups: a multiple of group_size), in one jitted scan; the same update
      with one micro-batch's activations alive at a time. None: the whole batch at once.
    advantage: "grpo" (centred, scaled by the group's std) or "dr_grpo" (centred only).
    negative_weight: the weight of negative advantages: 1 is GRPO as published, 0 keeps
      the positive ones only.
    shared_prefix: run each group's prompt once in the update (rlcode.rl.shared_prefix).
    pack_tokens: pack each group's completions into rows of this many tokens after its
      shared prompt, or with shared_prefix=false each after its own prompt copy
      (rlcode.rl.packing: the same loss and gradients, without padding every completion
      to the longest); at least max_new_tokens (plus the longest prompt without the shared
      prompt), with dense attention layers and one process. None: every completion padded
      to the longest.
    grammar: a file whose grammar every rollout follows where a task set fixes an answer
      format: a JSON schema (.json) or a Lark grammar (.lark; %json inside it). The engine
      masks each token to it (llguidance, rlcode.engine.grammar) and the update recomputes
      the masked distribution's log-probs (the batch carries the masks). Evaluation
      samples without it. None: unconstrained.
    micro_batch_tokens: with pack_tokens, accumulate the gradient over micro-batches of
      whole groups of at most this many computed tokens (prompts and packs) where whole
      groups allow (rlcode.rl.packing.micro_count); in place of micro_batch_rows.
    loss_aggregation: "seq_mean_token_mean" (GRPO), "token_mean" (DAPO) or
      "seq_mean_token_sum_norm" (Dr.GRPO).
    objective: the per-token surrogate (rlcode.rl.objective): "ppo" (the clipped token
      ratio), "gspo" (the clipped length-normalised sequence ratio), "gspo_token" (its
      value, the gradient per token) or "cispo" (REINFORCE weighted by a clipped,
      stop-gradient token ratio).
    clip_eps_low: the clip of the ratio below 1 (ppo per token, gspo per sequence, whose
      paper clips far tighter, about 3e-4).
    clip_eps_high: the clip above 1 (DAPO's clip-higher when larger than the low one).
    cispo_clip_low: "cispo": its weight is at least 1 - this; None: no lower bound.
    cispo_clip_high: "cispo": its weight is at most 1 + this.
    beta: the coefficient of the k3 KL to the frozen reference.
    log_kl: log the KL to the warm start as `kl` also when beta is 0.
    length_multiple: training batches are padded to multiples of this many tokens.
    max_staleness: asynchronous rollouts: sample up to this many policy versions ahead of
      the update (eta); 0 is the synchronous loop.
    max_importance_weight: the cap of a stale row's pi_prox / pi_behav weight (when
      rollout_correction is "none").
    rollout_correction: recompute every row's log-probs with the trainer's weights and
      correct by the ratio r to the sampler's (rlcode.rl.correction): "none" (only stale
      rows, as max_importance_weight says), "tis" (weight min(r, cap)) or "mis" (weight
      r, rows or tokens with r outside [low, cap] out of the loss).
    rollout_correction_level: "token" (each token's r) or "sequence" (the geometric mean
      of a row's token ratios).
    rollout_correction_cap: the upper bound of r ("tis": truncation, "mis": masking).
    rollout_correction_low: "mis": the lower bound of r.
    overlong_filter: completions cut at max_new_tokens train no token (DAPO's overlong
      filtering; their rewards still count in their groups' advantages).
    overlong_buffer: DAPO's soft overlong penalty over the last this many tokens of
      max_new_tokens (rlcode.rl.overlong); 0: none.
    overlong_penalty: the penalty's size at max_new_tokens.
    sample_version: "latest" (the newest allowed weights) or "oldest" (exactly k - eta).
    rollouts: "batch" (each step's groups sampled together, rlcode.rl.async_rollouts) or
      "partial" (groups decode on running engines; a step takes the first
      prompts_per_step to finish; new weights reach rows mid-flight, tokens older than
      max_staleness versions restarted: rlcode.rl.partial; needs max_staleness >= 1).
    in_flight_groups: "partial": groups kept decoding; None: (max_staleness + 1) x
      prompts_per_step.
    engine_processes: "partial": that many engines, each in a process of its own on this
      host (rlcode.engine.service: weights and finished groups over a socket; a process
      that dies is started again and its unanswered groups resubmitted); 0: the sampler
      mesh's engines in threads of the trainer's process.
    expert_slots: that many of each group's slots hold the task's expert episode.
    exclude_task_ids: a regular expression; training tasks whose id matches it are left
      out of GRPO's stream (the warm start still uses them); None: none.
    sample_rounds: DAPO's dynamic sampling, capped: up to this many rounds of tasks a
      step, keeping the groups whose rewards differ (rlcode.rl.dynamic); 1: plain GRPO.
      Not with rollouts = "partial".
    drop_idle_groups: the update runs only the groups whose rewards differ, with the loss
      and gradient of the whole batch.
    curriculum: "plain" (the seeded stream) or "signal" (families weighted by their recent
      groups with a signal, rlcode.rl.curriculum).
    curriculum_decay: "signal": the decay of each family's counts per update.
    curriculum_floor: "signal": the least weight a family keeps.
    distill_teacher: on-policy distillation (rlcode.rl.distill): a teacher sharing the
      tokenizer, a run's workdir or checkpoint directory or a Hugging Face checkpoint,
      scores the sampled tokens; None: no teacher.
    distill_coef: each trained token's advantage gains this times (teacher log-prob -
      sampler log-prob), the negative of the per-token reverse KL estimate.
    distill_only: the advantage is the distillation term alone (no task advantage; the
      rewards are still computed and logged).
    routing_replay: MoE policies: the update's forward uses the experts the sampler
      chose for each token (recorded with the samples) instead of re-routing them, the
      gate weights from the current router (rlcode.models.moe.route); without it the
      trainer's router may pick other experts than the sampler's for the same tokens and
      the importance ratios blow up (Qwen3-30B-A3B GRPO collapse).
  """

  group_size: int = key(8, ge=1)
  prompts_per_step: int = key(16, ge=1)
  temperature: float = key(1.0, gt=0)
  max_new_tokens: int = key(256, ge=1, only=("grpo",))
  num_passes: int = key(1, ge=1)
  micro_batch_rows: int | None = key(None, ge=1)
  advantage: str = key("grpo", choices=("grpo", "dr_grpo"))
  negative_weight: float = key(1.0, ge=0, le=1)
  shared_prefix: bool = key(True, only=("grpo",))
  pack_tokens: int | None = key(None, ge=1, only=("grpo",))
  micro_batch_tokens: int | None = key(None, ge=1, only=("grpo",))
  grammar: str | None = key(None, only=("grpo",))
  loss_aggregation: str = key("seq_mean_token_mean", choices=(
      "seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"))
  objective: str = key("ppo", choices=("ppo", "gspo", "gspo_token", "cispo"))
  clip_eps_low: float = key(0.2, ge=0)
  clip_eps_high: float = key(0.28, ge=0)
  cispo_clip_low: float | None = key(None, ge=0, le=1)
  cispo_clip_high: float = key(5.0, ge=0)
  beta: float = key(0.0, ge=0)
  log_kl: bool = key(False)
  length_multiple: int = key(32, ge=1, only=("grpo",))
  max_staleness: int = key(0, ge=0, only=("grpo",))
  max_importance_weight: float = key(2.0, ge=1, only=("grpo", "online"))
  rollout_correction: str = key("none", choices=("none", "tis", "mis"), only=("grpo",))
  rollout_correction_level: str = key("token", choices=("token", "sequence"), only=("grpo",))
  rollout_correction_cap: float = key(2.0, ge=1, only=("grpo",))
  rollout_correction_low: float = key(0.5, ge=0, le=1, only=("grpo",))
  overlong_filter: bool = key(False, only=("grpo",))
  overlong_buffer: int = key(0, ge=0, only=("grpo",))
  overlong_penalty: float = key(1.0, ge=0, only=("grpo",))
  sample_version: str = key("latest", choices=("latest", "oldest"), only=("grpo",))
  rollouts: str = key("batch", choices=("batch", "partial"), only=("grpo",))
  in_flight_groups: int | None = key(None, ge=1, only=("grpo",))
  engine_processes: int = key(0, ge=0, only=("grpo",))
  expert_slots: int = key(0, ge=0, only=("agent",))
  exclude_task_ids: str | None = key(None, only=("agent",))
  sample_rounds: int = key(1, ge=1, only=("grpo", "agent"))
  drop_idle_groups: bool = key(True, only=("agent",))
  curriculum: str = key("plain", choices=("plain", "signal"), only=("agent",))
  curriculum_decay: float = key(0.8, ge=0, lt=1, only=("agent",))
  curriculum_floor: float = key(0.05, gt=0, le=1, only=("agent",))
  distill_teacher: str | None = key(None, only=("grpo",))
  distill_coef: float = key(1.0, ge=0, only=("grpo",))
  distill_only: bool = key(False, only=("grpo",))
  routing_replay: bool = key(False, only=("grpo",))

  def __post_init__(self):
    rows = self.prompts_per_step * self.group_size
    if self.micro_batch_rows is not None and (
        rows % self.micro_batch_rows or self.micro_batch_rows % self.group_size):
      raise ValueError(f"rl.micro_batch_rows={self.micro_batch_rows} must divide the "
                       f"{rows} rows of a step into whole groups of {self.group_size}")
    if self.pack_tokens is not None:
      if self.pack_tokens < self.max_new_tokens:
        raise ValueError(f"rl.pack_tokens={self.pack_tokens} is less than rl.max_new_tokens="
                         f"{self.max_new_tokens}: a completion must fit in a pack")
      if self.routing_replay:
        raise ValueError("rl.routing_replay=true is not recorded in packed batches: unset "
                         "rl.pack_tokens")
    if self.engine_processes and self.rollouts != "partial":
      raise ValueError(f"rl.engine_processes={self.engine_processes} runs the partial "
                       "rollouts' engines apart: set rl.rollouts=partial")
    if self.grammar is not None:
      if not self.grammar.endswith((".json", ".lark")):
        raise ValueError(f"rl.grammar={self.grammar!r}: expected a JSON schema (.json) or a "
                         "Lark grammar (.lark)")
      if self.rollouts == "partial":
        raise ValueError("rl.grammar constrains batch rollouts: set rl.rollouts=batch")
    if self.micro_batch_tokens is not None and not self.pack_tokens:
      raise ValueError("rl.micro_batch_tokens cuts packed batches: set rl.pack_tokens "
                       "(or rl.micro_batch_rows for rows)")
    if self.micro_batch_tokens is not None and self.micro_batch_rows is not None:
      raise ValueError("rl.micro_batch_tokens and rl.micro_batch_rows both cut micro-batches: "
                       "set one of them")
    if self.overlong_buffer > self.max_new_tokens:
      raise ValueError(f"rl.overlong_buffer={self.overlong_buffer} must be at most "
                       f"rl.max_new_tokens={self.max_new_tokens}")
    if self.expert_slots >= self.group_size:
      raise ValueError(f"rl.expert_slots={self.expert_slots} must be < rl.group_size="
                       f"{self.group_size}: a group needs at least one sampled trajectory")
    if self.sample_rounds > 1 and self.rollouts == "partial":
      raise ValueError(f"rl.sample_rounds={self.sample_rounds} needs rl.rollouts=batch: "
                       "partial rollouts train the first groups to finish, one round")
    if self.distill_only and not self.distill_teacher:
      raise ValueError("rl.distill_only=true needs a teacher: set rl.distill_teacher")
    if self.distill_only and self.sample_rounds > 1:
      raise ValueError(f"rl.sample_rounds={self.sample_rounds} keeps groups by their task "
                       "rewards, which rl.distill_only=true does not train on: set one of them")
    if self.exclude_task_ids is not None:
      import re
      try:
        re.compile(self.exclude_task_ids)
      except re.error as e:
        raise ValueError(f"rl.exclude_task_ids={self.exclude_task_ids!r} is not a regular "
                         f"expression: {e}") from None
