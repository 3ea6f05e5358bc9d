"""Executable PR tasks: decomposition checked by tests, the agent on real repositories."""
