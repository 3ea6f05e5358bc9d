"""How well agent_tiny's warm start imitates the expert on validation tasks, teacher-forced.

The warm start (rlcode.agent.train.warm_start) trains on scripted expert episodes of
the training tasks. This script runs the same supervised steps and, every --eval_every
steps, feeds the expert episodes of the validation tasks through the policy and reads:

  greedy_exact  the share of episodes in which every expert token is the policy's
                argmax. The tools are deterministic, so this is the share of
                validation tasks the greedy policy solves exactly as the expert does
                (it may solve others another way): a sampling-free success estimate.
  token_acc     argmax accuracy on all expert tokens; text_acc on the tokens of the
                solution file the expert writes (name, operation, constant).
  t1_exact      the mean probability, at temperature 1, of sampling the expert's
                episode token for token.
  nll           mean negative log-likelihood per expert token.

and lists the most frequent wrong tokens with the text before them (which copy the
policy gets wrong: a name from the prompt, a constant from a tool's output).

    python -m experiments.agent.warm_start [--steps 300] [--eval_every 100] [--top 12] \
        [--config.model.tokenizer=bytes+tools --config.model.arch.vocab_size=264 ...]

Steps, batch and learning-rate schedule are the config's warmstart section unless
--steps is given (the cosine then decays over --steps). The config runs with the
settings its tables were made with (experiments.lib.agent.PLAIN). Prints its rows and
writes nothing; results: docs/journal.md (agent_tiny).
"""

from __future__ import annotations

import argparse
import collections
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.lib import agent as agent_lib
from experiments.lib.agent import CONFIG, PLAIN  # PLAIN: the settings its tables were made with
from rlcode import optim
from rlcode.agent import episodes
from rlcode.agent.demos import expert_trajectories, imitate
from rlcode.agent.step_groups import select_variants
from rlcode.config import loader
from rlcode.data import sources
from rlcode.models.build import build_model
from rlcode.parallel import sharding
from rlcode.rl import logprobs, sequences
FILE_TEXT = '"file_text":"'


def text_mask(tokenizer, traj) -> np.ndarray:
  """True on the tokens of the episode that lie inside the written file's text."""
  ends = np.array([len(tokenizer.decode(traj.tokens[:i + 1])) for i in range(len(traj.tokens))])
  text = tokenizer.decode(traj.tokens)
  lo = text.find(FILE_TEXT)
  if lo < 0:
    return np.zeros(len(traj.tokens), bool)
  lo += len(FILE_TEXT)
  hi = text.find('"}}', lo)
  return (ends > lo) & (ends <= hi)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--steps", type=int, default=None)
  p.add_argument("--eval_every", type=int, default=100)
  p.add_argument("--top", type=int, default=12, help="wrong tokens listed at each eval")
  args, overrides = p.parse_known_args(argv)
  config = loader.load_config(CONFIG, [*PLAIN, *overrides])
  ws = config.warmstart
  steps = args.steps or ws.steps
  opt_cfg = optim.OptimizerConfig.from_config(ws.optimizer)
  if args.steps:
    opt_cfg = optim.OptimizerConfig(**{**opt_cfg.__dict__, "decay_steps": steps})

  mesh = sharding.mesh_from_config(config.mesh)
  model, tok = build_model(config.model, mesh, config.seed)
  chat = episodes.chat_format(config.agent, tok)
  budgets = episodes.budgets(config.agent)
  envs = agent_lib.make_envs(config, 8)
  start = time.perf_counter()
  train = expert_trajectories(config.agent, config.seed, select_variants(
      config.agent.variants, sources.load(config.data, config.data.train_split)), envs, chat,
      budgets)
  val = expert_trajectories(config.agent, config.seed, select_variants(
      config.agent.variants, sources.load(config.data, config.data.eval_split)), envs, chat,
      budgets)
  for env in envs:
    env.close()
  print(f"expert episodes: {len(train)} train, {len(val)} validation "
        f"({time.perf_counter() - start:.0f} s)", flush=True)

  graphdef, params = nnx.split(model, nnx.Param)

  vb = episodes.sft_batch(val, tok.pad_id)
  expert = vb.mask > 0
  in_text = np.zeros_like(expert)
  for i, t in enumerate(val):
    in_text[i, :len(t.tokens)] = text_mask(tok, t)

  @jax.jit
  def teacher_forced(params, batch):
    logits, targets = sequences.window_logits(nnx.merge(graphdef, params), batch)
    return jnp.argmax(logits, -1) == targets, logprobs.token_logprobs(logits, targets)

  def evaluate(step, params, loss):
    ok, logp = map(np.asarray, teacher_forced(params, vb))
    row = dict(
        step=step, loss=round(loss, 4),
        greedy_exact=round(float(np.all(ok | ~expert, 1).mean()), 3),
        token_acc=round(float(ok[expert].mean()), 4),
        text_acc=round(float(ok[in_text].mean()), 4),
        t1_exact=round(float(np.exp((logp * expert).sum(1)).mean()), 3),
        nll=round(float(-(logp * expert).sum() / expert.sum()), 4))
    print(row, flush=True)
    wrong = collections.Counter()
    for i, t in enumerate(val):
      for j in np.flatnonzero(expert[i] & ~ok[i]):
        wrong[f"{tok.decode(t.tokens[max(0, j - 12):j])!r} -> {tok.decode(t.tokens[j:j + 1])!r}"] += 1
    for text, n in wrong.most_common(args.top):
      print(f"    {n:3d}  {text}")

  step_losses, start = [], time.perf_counter()

  def on_step(step, params, loss):
    step_losses.append(loss)
    if step % args.eval_every == 0 or step == steps:
      print(f"step {step}: {time.perf_counter() - start:.0f} s", flush=True)
      evaluate(step, params, float(np.mean(jax.device_get(step_losses[-20:]))))

  # The warm start's own supervised steps (rlcode.agent.train.imitate), evaluated mid-run.
  imitate(graphdef, params, train, tok.pad_id, mesh, optimizer=opt_cfg,
          batch_size=ws.batch_size, seed=config.seed + 1, steps=steps, on_step=on_step)


if __name__ == "__main__":
  main()
