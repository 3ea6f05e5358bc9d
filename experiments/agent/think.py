"""Think after each tool call vs think once at the start vs no think tool.

Three arms of configs/agent_tiny.py on all its tasks, with the think tool added to
the arms that use it; they differ only in their experts' habit (the warm start
teaches it; GRPO may keep or drop it):
  none   editor, search, run_tests, finish; no thoughts.
  start  + think; one plan first ("read config.txt, write solution.py").
  each   + think; a note after every tool call ("OFFSET is 7", "written").
Same budgets (turns, tokens: a thought costs both), steps and hyperparameters.
The table reports the held-out split once, at the end (and the warm start's).

    python -m experiments.agent.think [--seeds 0] [--warm-start-only] [--name agent_think]
        [--config.a.b=value ...]

The runs and agent_think.json stay under experiments/out/agent_think/; the result goes to
results/agent/NAME. Like agent/tools.py it runs the settings before the stale notes
(experiments.lib.agent.PLAIN).
"""

from __future__ import annotations

from experiments.lib.agent import study

TOOLS = "('editor','search','run_tests','finish')"
THINK_TOOLS = "('editor','search','run_tests','think','finish')"
ARMS = {
    "none": [f"--config.agent.tools={TOOLS}", "--config.agent.think=none"],
    "start": [f"--config.agent.tools={THINK_TOOLS}", "--config.agent.think=start"],
    "each": [f"--config.agent.tools={THINK_TOOLS}", "--config.agent.think=each"],
}

if __name__ == "__main__":
  study(ARMS, __doc__.splitlines()[0], "agent_think")
