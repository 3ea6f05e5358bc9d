"""Multi-turn tool use: environments, tools, trajectories as tokens, GRPO over them.

Layout:
  chat      the chat formats (compact, hermes): prompts, observation tokens, stop tokens
  calls     parsing `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, checked
  tools     bash, editor, search, run_tests, think, memory, finish
  memory    notes across a run's episodes and the rules that keep or forget them
  env       ToolEnv: reset(task) -> observation, step(turn) -> observation, reward, done,
            the workspace in one sandbox session (rlcode.sandbox.session)
  sampler   episodes of G rows per task with each row's KV cache kept across turns
  expert    scripted expert episodes for the warm start
  rollout   environments from a config, GRPO and supervised batches, episode metrics
  train     the loop (`rlcode train` with a config that has an `agent` section)
"""
