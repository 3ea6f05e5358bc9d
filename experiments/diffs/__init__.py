"""RL from diffs: configs/grpo_diffs.py over seeds, reevaluation, format errors, the diff reward against weak tests, decomposition of PRs."""
