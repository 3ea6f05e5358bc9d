"""Terminal only vs the richer tools, same budget: success and context tokens used.

Two arms of configs/agent_tiny.py (with the settings before the stale notes,
experiments.lib.agent.PLAIN) on the tasks a terminal can solve (the file and
search variants of data/agent_tasks.jsonl; the tests variant needs run_tests):
  rich      editor, search, run_tests, finish; experts view/search, create, finish.
  terminal  bash, finish; experts `cat FILE` or `grep -rn SYMBOL .`, a heredoc into
            solution.py, finish.
Same budgets (turns, tokens), same steps and hyperparameters (tuned on the default
config's validation split, not per arm). Each arm trains from scratch (warm start
on its own experts, then GRPO); the table reports the held-out split once, at the
end: success, context tokens and tool calls per episode, and the warm start's.

    python -m experiments.agent.tools [--seeds 0] [--warm-start-only] [--name agent_tools]
        [--config.a.b=value ...]

--warm-start-only stops each arm after its warm start (no GRPO steps) and compares
the warm starts, at the same number of supervised steps.

The runs and agent_tools.json stay under experiments/out/agent_tools/; the result goes to
results/agent/NAME.
"""

from __future__ import annotations

from experiments.lib.agent import study

ARMS = {
    "rich": ["--config.agent.tools=('editor','search','run_tests','finish')",
             "--config.agent.toolset=rich"],
    "terminal": ["--config.agent.tools=('bash','finish')", "--config.agent.toolset=terminal"],
}
COMMON = ["--config.agent.variants=('file','search')"]


if __name__ == "__main__":
  study({k: [*COMMON, *v] for k, v in ARMS.items()}, __doc__.splitlines()[0], "agent_tools")
