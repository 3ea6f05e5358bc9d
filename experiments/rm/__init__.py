"""Reward models of user choices: saturation, and selecting one of k samples."""
