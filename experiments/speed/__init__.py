"""Speed on a CPU: attention, generation, KV reuse, the shared-prefix update, the sandbox, the plan estimate."""
