"""The tool-using agent (configs/agent_tiny.py): seeds, families, episodes, warm start, tools, memory, KV across turns, step cost."""
