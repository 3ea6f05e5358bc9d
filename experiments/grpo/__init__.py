"""GRPO on the default job: seeds with a cross-entropy control, asynchronous rollouts, a learned reward."""
