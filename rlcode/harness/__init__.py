"""Harness rollouts: episodes that an outside harness drives through `rlcode serve`, kept as
token-exact trajectories.

  segments.py   calls to segments: a call continues its segment when its prompt extends
                the segment's context, else a new segment starts (the split counted)
  recorder.py   the episodes, by id, in memory and thread-safe: calls, segments, splits

The server's side (the X-Episode-Id header, GET and DELETE /v1/episodes/{id}) is
rlcode.serve.episodes.

A segment carries what `rlcode.agent.episodes.grpo_batch` reads of a trajectory (prompt,
tokens, mask, logprobs), so a segment trains as the built-in agent's episodes do.
"""

from rlcode.harness.recorder import HEADER, Call, Episode, Recorder, Sample, check_id
from rlcode.harness.segments import Segment, Split

__all__ = ["HEADER", "Call", "Episode", "Recorder", "Sample", "Segment", "Split", "check_id"]
