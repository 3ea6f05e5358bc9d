"""Memory across the episodes of a run, and the rules that decide what it keeps.

The policy writes notes with the `memory` tool (`store`) and reads the notes
closest to a query (`retrieve`). What is kept is not learned: a rule, chosen by
name, decides at the end of each episode which of its proposed notes (and which
facts of the episode itself) enter the memory, and which old notes are forgotten.

Rules (`RULES`):
  never          keep nothing.
  all            keep every note the policy stored.
  after_success  keep an episode's notes only if it succeeded.
  error_fix      keep, for each failing test run later fixed in the episode, the pair
                 "error -> fix" (the failure and the solution that passed), and the
                 notes of successful episodes.
  last_n         `all`, then forget all but the newest `capacity` notes.
  dedupe         `all`, but a note whose embedding is within `dedupe_cosine` of a kept
                 one replaces it instead of joining it.
  success_dedupe after_success, deduplicated as by dedupe, and capped as by last_n.
experiments/agent/memory.py compares them on 240 tasks where an earlier episode's
note helps a later one: all, after_success and dedupe tie for the best success (0.685
against 0.490 with never, 2 seeds; its tiebreak on context tokens picks all, by 0.04
tokens per episode). DEFAULT_RULE is dedupe: the same success with a quarter of the
notes. The capped rules (last_n, success_dedupe; 16 notes there) lose what they forget.

A note the policy stores holds at most MAX_NOTE_CHARS characters (the memory tool refuses
a longer one): notes come back into later prompts, three at a time.

Retrieval ranks notes by cosine similarity of MiniLM embeddings when an `embed`
function is given, else by word overlap (Jaccard). Thread-safe: a GRPO step runs
its episodes at once. This module must not know about sandboxes or tokens.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Callable, Sequence

import numpy as np

from rlcode.errors import UnknownKey

RULES = ("never", "all", "after_success", "error_fix", "last_n", "dedupe", "success_dedupe")
DEFAULT_RULE = "dedupe"
MAX_NOTE_CHARS = 2000


@dataclasses.dataclass
class EpisodeRecord:
  """What a rule may read about a finished episode.

  proposed: the notes the policy stored, in order. success: the final reward
  counted as a success. fixes: (failure message, program that then passed) pairs.
  """

  proposed: list[str]
  success: bool
  fixes: list[tuple[str, str]]


def _words(text: str) -> set[str]:
  return set(re.findall(r"\w+", text.lower()))


class Memory:
  """The run's notes under one rule.

  Args:
    rule: one of RULES.
    embed: texts -> L2-normalised embeddings [N, D]; None ranks by word overlap
      (and `dedupe` compares word sets).
    capacity: notes kept by last_n and success_dedupe.
    dedupe_cosine: similarity at or above which two notes count as one.
  """

  def __init__(self, rule: str = DEFAULT_RULE, *,
               embed: Callable[[Sequence[str]], np.ndarray] | None = None,
               capacity: int = 32, dedupe_cosine: float = 0.9):
    if rule not in RULES:
      raise UnknownKey(f"agent.memory_rule={rule!r}; known: {list(RULES)}")
    if capacity < 1:
      raise ValueError(f"memory capacity must be >= 1, got {capacity}")
    self.rule, self.embed = rule, embed
    self.capacity, self.dedupe_cosine = capacity, dedupe_cosine
    self.notes: list[str] = []
    self._vecs: list[np.ndarray] = []
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return len(self.notes)

  def episode(self) -> EpisodeNotes:
    """A handle for one episode: its proposals, and retrieval from the run's notes."""
    return EpisodeNotes(self)

  def _vector(self, text: str) -> np.ndarray | None:
    return None if self.embed is None else np.asarray(self.embed([text])[0], np.float32)

  def _similarity(self, query: str, qvec, i: int) -> float:
    if qvec is not None:
      return float(self._vecs[i] @ qvec)
    a, b = _words(query), _words(self.notes[i])
    return len(a & b) / max(len(a | b), 1)

  def retrieve(self, query: str, k: int) -> list[str]:
    """Up to k notes, most similar first (ties: newest first)."""
    qvec = self._vector(query)
    with self._lock:
      scored = [(self._similarity(query, qvec, i), i) for i in range(len(self.notes))]
      scored.sort(key=lambda s: (-s[0], -s[1]))
      return [self.notes[i] for score, i in scored[:k] if score > 0]

  def _add(self, text: str, dedupe: bool) -> None:
    vec = self._vector(text)
    with self._lock:
      if dedupe:
        for i in range(len(self.notes)):
          same = (self._similarity(text, vec, i) >= self.dedupe_cosine if vec is not None
                  else _words(text) == _words(self.notes[i]))
          if same:
            del self.notes[i]
            if self._vecs:
              del self._vecs[i]
            break
      self.notes.append(text)
      if vec is not None:
        self._vecs.append(vec)
      if self.rule in ("last_n", "success_dedupe") and len(self.notes) > self.capacity:
        del self.notes[0]
        if self._vecs:
          del self._vecs[0]

  def restore(self, notes: Sequence[str]) -> None:
    """Replaces the notes (a resumed run's, saved with its checkpoint)."""
    with self._lock:
      self.notes, self._vecs = [], []
    for text in notes:
      vec = self._vector(text)
      with self._lock:
        self.notes.append(text)
        if vec is not None:
          self._vecs.append(vec)

  def end_episode(self, record: EpisodeRecord) -> None:
    """Applies the rule to a finished episode."""
    rule = self.rule
    if rule == "never":
      return
    keep = list(record.proposed)
    if rule in ("after_success", "success_dedupe") and not record.success:
      keep = []
    if rule == "error_fix":
      keep = (keep if record.success else []) + [
          f"error: {err} -> fix: {fix}" for err, fix in record.fixes]
    for text in keep:
      self._add(text, dedupe=rule in ("dedupe", "success_dedupe"))


class EpisodeNotes:
  """One episode's view of the memory (what the `memory` tool calls)."""

  def __init__(self, memory: Memory):
    self.memory = memory
    self.proposed: list[str] = []

  def propose(self, text: str) -> None:
    self.proposed.append(text)

  def retrieve(self, query: str, k: int) -> list[str]:
    return self.memory.retrieve(query, k)

  def close(self, success: bool, fixes: Sequence[tuple[str, str]]) -> None:
    self.memory.end_episode(EpisodeRecord(list(self.proposed), success, list(fixes)))
