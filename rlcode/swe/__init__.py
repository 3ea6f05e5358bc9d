"""Executable PR tasks (SWE-bench style) from any git history.
"""
