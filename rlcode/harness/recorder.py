"""Episodes of an outside harness, recorded call by call as the server answers them.

An episode is named by its id, which the harness chooses (an `X-Episode-Id` header on
each call): 1 to 128 characters of [A-Za-z0-9_.:-]. The id is the episode's only key:
whoever knows it can read and drop the episode, and no call reaches another episode
than the one its id names, so a harness should make its ids unguessable (a uuid4).

Each call is appended to its episode in the order the calls finish: the response id, the
prompt's length, and every candidate's sampled tokens, behaviour log-probs, per-token
policy versions and finish reason; the trajectory follows the chosen candidate (0: the
server takes episode calls with n = 1). The segments (rlcode.harness.segments) grow as
calls arrive; a call's prompt is its segment's context up to `prompt_tokens` (a segment
only grows at its end). Splits are counted by reason, per episode and in total.

Everything is held in memory, behind one lock, so the engine's thread, the event loop and
a trainer in the same process may all use one Recorder. At most `max_episodes` are held:
a new episode past that drops the one least recently written (counted as evicted).
This module must not know about HTTP.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import logging
import re
import threading
import time
from collections.abc import Sequence

from rlcode.harness import segments as segments_lib
from rlcode.harness.segments import Segment, Split

log = logging.getLogger(__name__)

HEADER = "X-Episode-Id"
MAX_ID_CHARS = 128
_ID = re.compile(r"[A-Za-z0-9_.:-]+")


def check_id(episode: str) -> str:
  """`episode` when it is a valid episode id, else ValueError saying why."""
  if not isinstance(episode, str) or not episode:
    raise ValueError("an episode id is 1 to 128 characters of A-Z a-z 0-9 _ . : -; got an "
                     "empty one")
  if len(episode) > MAX_ID_CHARS:
    raise ValueError(f"an episode id is at most {MAX_ID_CHARS} characters; got "
                     f"{len(episode)}")
  if not _ID.fullmatch(episode):
    raise ValueError("an episode id is made of A-Z a-z 0-9 _ . : - only")
  return episode


@dataclasses.dataclass(frozen=True)
class Sample:
  """One candidate of a call: what the engine sampled."""

  tokens: tuple[int, ...]
  logprobs: tuple[float, ...]
  versions: tuple[int, ...]
  finish_reason: str | None = None

  def to_json(self) -> dict:
    return {"tokens": list(self.tokens), "logprobs": list(self.logprobs),
            "versions": list(self.versions), "finish_reason": self.finish_reason}


@dataclasses.dataclass(frozen=True)
class Call:
  """One call of an episode: its response id, the prompt's length, its candidates, the
  one the trajectory follows, and the segment it went to."""

  id: str
  prompt_tokens: int
  candidates: tuple[Sample, ...]
  chosen: int
  segment: int

  def to_json(self) -> dict:
    return {"id": self.id, "prompt_tokens": self.prompt_tokens, "chosen": self.chosen,
            "segment": self.segment, "candidates": [c.to_json() for c in self.candidates]}


@dataclasses.dataclass
class Episode:
  """An episode's calls, its segments and its splits."""

  id: str
  calls: list[Call] = dataclasses.field(default_factory=list)
  segments: list[Segment] = dataclasses.field(default_factory=list)
  splits: list[Split] = dataclasses.field(default_factory=list)
  created: float = dataclasses.field(default_factory=time.time)
  updated: float = dataclasses.field(default_factory=time.time)

  def split_counts(self) -> dict[str, int]:
    counts = collections.Counter(s.reason for s in self.splits)
    return {reason: counts[reason] for reason in segments_lib.REASONS}

  def to_json(self) -> dict:
    return {"id": self.id, "object": "episode", "created": self.created,
            "updated": self.updated, "calls": [c.to_json() for c in self.calls],
            "segments": [s.to_json() for s in self.segments],
            "splits": self.split_counts(), "split_events": [s.to_json() for s in self.splits]}


class Recorder:
  """The episodes being recorded, by id (thread-safe)."""

  def __init__(self, max_episodes: int = 4096):
    if max_episodes < 1:
      raise ValueError(f"max_episodes={max_episodes} must be >= 1")
    self.max_episodes = max_episodes
    self._episodes: collections.OrderedDict[str, Episode] = collections.OrderedDict()
    self._lock = threading.Lock()
    self._totals = collections.Counter()

  def record(self, episode: str, call_id: str, prompt: Sequence[int],
             candidates: Sequence[Sample], chosen: int = 0) -> Split | None:
    """Appends a call to `episode` (made on its first call); the split it caused, if any."""
    check_id(episode)
    if not 0 <= chosen < len(candidates):
      raise ValueError(f"chosen={chosen} is not one of the call's {len(candidates)} "
                       "candidates")
    pick = candidates[chosen]
    if not len(pick.tokens) == len(pick.logprobs) == len(pick.versions):
      raise ValueError(f"a candidate of {len(pick.tokens)} tokens has {len(pick.logprobs)} "
                       f"log-probs and {len(pick.versions)} versions")
    with self._lock:
      ep = self._episodes.get(episode)
      if ep is None:
        ep = self._episodes[episode] = Episode(id=episode)
        self._totals["episodes"] += 1
        while len(self._episodes) > self.max_episodes:
          self._episodes.popitem(last=False)
          self._totals["episodes_evicted"] += 1
      self._episodes.move_to_end(episode)
      split = segments_lib.extend(ep.segments, len(ep.calls), prompt, pick.tokens,
                                  pick.logprobs, pick.versions)
      ep.calls.append(Call(id=call_id, prompt_tokens=len(prompt), candidates=tuple(candidates),
                           chosen=chosen, segment=len(ep.segments) - 1))
      ep.updated = time.time()
      self._totals["calls"] += 1
      if split is not None:
        ep.splits.append(split)
        self._totals[f"splits_{split.reason}"] += 1
        log.debug("episode call %d starts segment %d: %s at token %d", split.call,
                  len(ep.segments) - 1, split.reason, split.at)
      return split

  def get(self, episode: str) -> Episode | None:
    """A copy of the episode (None when it is not held), safe to read while calls arrive."""
    with self._lock:
      ep = self._episodes.get(episode)
      return copy.deepcopy(ep) if ep is not None else None

  def to_json(self, episode: str) -> dict | None:
    with self._lock:
      ep = self._episodes.get(episode)
      return ep.to_json() if ep is not None else None

  def drop(self, episode: str) -> bool:
    """Forgets the episode; whether it was held."""
    with self._lock:
      return self._episodes.pop(episode, None) is not None

  def stats(self) -> dict[str, int]:
    """Episodes held now, and since the start: episodes, calls, splits by reason, evicted."""
    with self._lock:
      out = {"episodes_held": len(self._episodes), "episodes_started": self._totals["episodes"],
             "episodes_evicted": self._totals["episodes_evicted"],
             "episode_calls": self._totals["calls"]}
      out.update({f"episode_splits_{r}": self._totals[f"splits_{r}"]
                  for r in segments_lib.REASONS})
      return out
