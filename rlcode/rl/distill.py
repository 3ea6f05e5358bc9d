"""On-policy distillation: a teacher's per-token log-probabilities as a dense reward.

The student samples as usual; a teacher (any policy sharing the tokenizer: rl.distill_teacher,
loaded by rlcode.policy.teacher) scores every sampled token y_t in one batched forward on
the trainer's mesh, the way the reference log-probs are computed
(rlcode.rl.grpo.make_logprob_fn, in the batch's layout). The per-token reward is the
negative of the one-sample estimate of the reverse KL at that token,

    r_t = log p_teacher(y_t | x, y_<t) - log p_behaviour(y_t | x, y_<t),

with the sampler's own log-probs (the policy that drew y_t), and the advantage of each
trained token becomes

    A_t = A + coef * r_t        (A: the row's task advantage; 0 with rl.distill_only)

This is the formulation of Thinking Machines' "On-Policy Distillation" (tinker-cookbook's
incorporate_kl_penalty: the advantage gains -coef * (sampled log-prob - teacher log-prob),
discount 0), of slime's --use-opd (A_t = A - coef * KL_t, on top of any estimator) and of
verl's and Trinity's OPD advantages (coef * (teacher - student)). The objective
(rl.objective, its clip, the corrections of rlcode.rl.correction) then treats A_t as any
advantage. Both log-probs are under rl.temperature, as the reference's are (at 1, the
default, the distributions themselves).

What is approximated: r_t is the single-sample estimate of a token's reverse KL, not the
KL over the vocabulary; each token's reward is its own (no sum over the tokens after it);
the task advantage is GRPO's per-row one, added to each token.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from rlcode.rl import grpo, objective


@dataclasses.dataclass(frozen=True)
class Distill:
  """coef: the weight of the distillation reward; only: the task advantage is left out."""

  coef: float = 1.0
  only: bool = False


def token_rewards(teacher_nt, behaviour_nt, mask_nt):
  """r_t = teacher - behaviour log-prob [N, W] on trained tokens (mask > 0), 0 elsewhere."""
  return jnp.where(mask_nt > 0, teacher_nt - behaviour_nt, 0.0)


def token_advantages(adv_n, reward_nt, distill: Distill):
  """A_t [N, W] = A (the row's, [N]; 0 with `only`) + coef * r_t."""
  base = jnp.zeros_like(reward_nt) if distill.only else jnp.broadcast_to(
      jnp.asarray(adv_n, jnp.float32)[:, None], reward_nt.shape)
  return base + distill.coef * reward_nt


class Teacher:
  """A teacher's params on the trainer mesh and its two jitted steps: the log-probs of a
  batch's targets (grpo.make_logprob_fn, laid out like the batch's [N, W] leaves) and the
  per-token advantages.

  Args:
    graphdef, params: the teacher (nnx.split(model, nnx.Param)).
    mesh: the trainer's mesh. temperature: rl.temperature.
    rows: the batch's rows. distill: the coefficient and `only`.
    logprob_fn: the batch layout's log-prob function (None: the repeated layout).
  """

  def __init__(self, graphdef, params, mesh: Mesh, temperature: float, rows: int,
               distill: Distill, logprob_fn=None):
    self.params, self.distill = params, distill
    self._logprobs = grpo.make_logprob_fn(graphdef, mesh, temperature, logprob_fn, rows)

    def combine(teacher, adv, behaviour, mask):
      reward = token_rewards(teacher, behaviour, mask)
      metrics = {"distill_reverse_kl": objective.masked_mean(-reward, mask),
                 "distill_teacher_logp": objective.masked_mean(teacher, mask)}
      return token_advantages(adv, reward, distill), reward, metrics

    rows_sh = grpo.rows_sharding(mesh, rows)
    self._combine = jax.jit(combine, out_shardings=(rows_sh, rows_sh, None))

  def logprobs(self, batch):
    """The teacher's log-probs [N, W] of the batch's targets."""
    return self._logprobs(self.params, batch)

  def __call__(self, batch):
    """(advantages [N, W], rewards r_t [N, W], metrics) of a batch whose old_logp still
    holds the sampler's log-probs (before any recomputation replaces them): the metrics are
    distill_reverse_kl (the mean over trained tokens of -r_t) and distill_teacher_logp."""
    return self._combine(self.logprobs(batch), batch.adv, batch.old_logp, batch.mask)
