"""Harness rollouts: episodes that an outside harness drives through `rlcode serve`, kept as
token-exact trajectories.

  segments.py   calls to segments: a call continues its segment when its prompt extends
                the segment's context, else a new segment starts (the split counted)
  recorder.py   the episodes, by id, in memory and thread-safe: calls, segments, splits
  rollouts.py   GRPO rollouts of any harness(task, base_url, api_key, episode_id): G
                episodes a task on bounded threads, their segments and the environment's
                rewards as the shared-prompt batch, failed episodes' groups dropped, counted
  examples.py   an example harness (the openai client, two calls a code task, the tests
                between them) and its reward; configs/harness_tiny.py trains on it
  verifiers_env.py  environments of the `verifiers` package as a harness: their rows the
                tasks, their own rollouts the episodes, their rubrics the rewards
                (harness.verifiers; configs/harness_verifiers.py)
  openenv_env.py  rlcode's code tasks as an OpenEnv (openenv-core) environment, served by
                openenv's app on a loopback port, and the harness that plays it through
                openenv's client (harness.openenv; configs/harness_openenv.py)
  mini_swe.py   mini-swe-agent (unmodified) on executable PR tasks: its agent and litellm
                model on the policy's endpoint, its commands in rlcode's sandbox, the
                tasks' tests the reward (harness.mini_swe_agent; configs/harness_mini_swe.py)

The server's side (the X-Episode-Id header, GET and DELETE /v1/episodes/{id}) is
rlcode.serve.episodes; rlcode.serve.local.LocalServer serves a policy in this process (a
loopback port), the server the rollouts take; rlcode.train.harness_loop (trainer
"harness") is the GRPO loop on them.

A segment carries what `rlcode.agent.episodes.grpo_batch` reads of a trajectory (prompt,
tokens, mask, logprobs), so a segment trains as the built-in agent's episodes do.
"""

from rlcode.harness.recorder import HEADER, Call, Episode, Recorder, Sample, check_id
from rlcode.harness.segments import Segment, Split

__all__ = ["HEADER", "Call", "Episode", "Recorder", "Sample", "Segment", "Split", "check_id"]
