"""Short training runs of the default job at toy sizes, shared by the scale-out tests.

The rewards are the format check alone (no sandbox, so a step is cheap): about one
random program in sixteen parses, which leaves some groups of eight with a signal, so
the losses and the parameters move and comparisons between runs mean something. The
tasks (tests/data/scale_tasks.jsonl, problems of data/tiny_tasks.jsonl with prompts
of 36-60 characters) fall in one padded prompt length, and attention is the dense
reference: each program compiles once, which is most of what these runs cost on CPU.
"""

import json
import os

from rlcode.config import loader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "grpo_tiny.py")
# The toy policy: one small layer, dense-reference attention (each program compiles fast).
SMALL_MODEL = [
    "--config.model.arch.hidden_size=32", "--config.model.arch.intermediate_size=64",
    "--config.model.arch.num_layers=1", "--config.model.arch.num_heads=2",
    "--config.model.arch.num_kv_heads=2", "--config.model.arch.head_dim=16",
    "--config.model.attn_impl=reference",
]
# A job of the toy policy run through the CLI (harness and task-source tests): its context
# as long as their prompts need, no progress bar, no TensorBoard files.
SMALL_JOB = [*SMALL_MODEL, "--config.model.arch.max_seq_len=384",
             "--config.train.progress_bar=false", "--config.logging.tensorboard=false"]
TINY = [
    *SMALL_MODEL,
    f"--config.data.path={os.path.join(ROOT, 'tests', 'data', 'scale_tasks.jsonl')}",
    "--config.rl.prompts_per_step=4", "--config.rl.group_size=8",
    "--config.rl.max_new_tokens=12", "--config.eval.max_new_tokens=12",
    "--config.eval.num_samples=2", "--config.eval.ks=(1, 2)", "--config.data.max_eval_tasks=4",
    "--config.warmstart.steps=0", "--config.train.steps=2", "--config.train.checkpoint_every=2",
    "--config.train.eval_every=0", "--config.train.progress_bar=false",
    "--config.rewards.tests=0.0", "--config.rewards.format=1.0",
    "--config.rl.log_kl=false", "--config.optimizer.learning_rate=0.03",
]
# Keys whose values are wall-clock measurements.
TIMING = ("tokens_per_s", "seconds")


def config(workdir, *overrides):
  return loader.load_config(CONFIG, TINY + [f"--config.workdir={workdir}", *overrides])


def metrics_rows(workdir):
  """The rows of a run's metrics.jsonl."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def steps(rows):
  """The per-step rows (not eval rows), without timing keys."""
  return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)}
          for r in rows if "loss" in r]
