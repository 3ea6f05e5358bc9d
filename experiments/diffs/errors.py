"""Why a diff policy's answers fail: its sampled answers' format errors, counted by kind.

    python -m experiments.diffs.errors POLICY [--samples 16] [--split validation]
        [--show 3] [--config.a.b=v ...]

POLICY is a workdir, a workdir's warm_start/ or a checkpoint directory of
configs/grpo_diffs.py (with the overrides it was trained with). Its answers are
sampled as the config's eval rows are (the same seed, T, budget) but with
--samples answers a task, and scored by the diff reward itself
(rlcode.rewards.diffs.diff_reward, whose details name each answer's error). Prints one
line per error code, `bad_range` split into ranges outside the file (or, when the
ranges count the shown lines, outside those) and blocks out of order, and how many failing
answers have a malformed marker line (a line that starts like a fence or a tag, or
holds "LINES", "REPLACE" or a tag's end, but is not one), then --show examples
of each code. Writes nothing.
"""

from __future__ import annotations

import argparse
import collections
import os
import re

from experiments.lib import ROOT, heldout, runs
from rlcode.config import loader
from rlcode.policy import policy_eval
from rlcode.parallel import sharding
from rlcode.rewards import diffs
from rlcode.rl import rollout

CONFIG = os.path.join(ROOT, "configs", "grpo_diffs.py")
_MARKER = re.compile(r"^(<think>|</think>|<solution>|</solution>|<<<<<<< LINES \d+([+-]\d+)?"
                     r"|>>>>>>> REPLACE)$")
_MARKER_PARTS = ("LINES", "REPLACE", "think>", "solution>")


def malformed_marker(text: str) -> bool:
  """Whether a line of `text` looks like a marker of a line-edit answer but is not one."""
  return any((line.startswith(("<", ">")) or any(p in line for p in _MARKER_PARTS))
             and not _MARKER.match(line) for line in text.splitlines())


def kind(detail: dict) -> str:
  """The error kind of an answer's reward details ("valid" for none)."""
  code = detail.get("error", "valid")
  if code == "bad_range":
    message = detail["message"]
    if "precedes" in message:
      return "bad_range: out of order"
    # Ranges that count the shown lines (line_numbers="shown") fail against those.
    return ("bad_range: outside the shown lines" if "shown" in message or "prompt shows" in message
            else "bad_range: outside the file")
  return code


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("policy")
  parser.add_argument("--samples", type=int, default=16)
  parser.add_argument("--split", default="validation")
  parser.add_argument("--show", type=int, default=2, help="examples printed per error kind")
  args, extra = parser.parse_known_args()
  for item in extra:
    if not item.startswith("--config."):
      parser.error(f"unknown argument {item!r}")
  config = loader.load_config(CONFIG, extra + ["--config.train.progress_bar=false"])
  mesh = sharding.mesh_from_config(config.mesh)
  model, tokenizer, step, directory = runs.restore_policy(config, args.policy, mesh)
  tasks, _ = rollout.fit_tasks(heldout.tasks(config, args.split), tokenizer, split=args.split,
                               max_seq_len=model.cfg.max_seq_len,
                               max_new_tokens=config.eval.max_new_tokens,
                               drop_too_long=bool(config.data.drop_too_long))
  row_tasks, texts = policy_eval.sample_completions(
      model, tokenizer, tasks, num_samples=args.samples, temperature=config.eval.temperature,
      max_new_tokens=config.eval.max_new_tokens, seed=config.seed + 7919,
      batch_prompts=config.eval.batch_prompts, mesh=mesh)
  counts, marked, examples = collections.Counter(), collections.Counter(), {}
  details = diffs.diff_reward(row_tasks, texts).details
  for task, text, detail in zip(row_tasks, texts, details):
    k = kind(detail)
    counts[k] += 1
    marked[k] += k != "valid" and malformed_marker(text)
    examples.setdefault(k, []).append((task.id, detail.get("message", ""), text))
  n = len(texts)
  print(f"{directory} (step {step}): {len(tasks)} {args.split} tasks x {args.samples} answers")
  print("| answers | count | share | with a malformed marker line |\n|---|---:|---:|---:|")
  for k, c in counts.most_common():
    print(f"| {k} | {c} | {c / n:.3f} | {marked[k] if k != 'valid' else '-'} |")
  for k, rows in examples.items():
    for task_id, message, text in ([] if k == "valid" else rows[:args.show]):
      print(f"\n--- {k}: {task_id}: {message}\n{text}")


if __name__ == "__main__":
  main()
