"""Experiment scripts by topic, run from the repository root as modules
(`python -m experiments.<topic>.<script>`), and the library they share (experiments.lib)."""
