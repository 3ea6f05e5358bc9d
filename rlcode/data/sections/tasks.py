"""Section-prediction tasks of split documents, and the train/test split by document.

A task is made for every section that has a heading (or is a plain-text block),
has a non-blank section before it, and whose target has at least
`min_target_chars` characters and at most `max_target_tokens` tokens:

    prompt    = "<title>\\n\\n" + <preceding sections, raw> + <the section's heading>
    reference = the section's body without leading blank lines and trailing
                whitespace

The title is the text of the first heading of a Markdown/RST document that
starts with one (then it is not repeated while that heading is still in the
context), else the document's name (its id). The context is trimmed from
the front to the token budget: `count(title line) + count(context) +
count(heading) <= context_budget`, with `count` the tokenizer callable given
(default: whitespace-separated words) applied per section and summed. Whole
sections are dropped from the front; when even the nearest preceding section
does not fit, its longest fitting tail is kept, cut at a line start (at a
whitespace boundary when no line-start tail with text fits). When nothing but
blank text fits beside the title and heading, the task is skipped
(`over_budget`).

Splits are by document, so no document is in two: with h the first 8 bytes of
sha256(document id), as an integer, modulo 10_000, a document is held out
("test") when h < `held_out_fraction * 10_000`, in "validation" (a split to
tune on, made only when `validation_fraction` > 0) when h is below
`(held_out_fraction + validation_fraction) * 10_000`, and in "train" otherwise.

This module must not read files nor tokenize for a model: `count_tokens` is
given; it only makes Tasks.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import re
from collections.abc import Callable, Iterable, Sequence

from rlcode.data.sections.splitters import TARGET_KINDS, Document, Section, split_document
from rlcode.data.tasks import Task

SPLITS = ("train", "validation", "test")


def whitespace_tokens(text: str) -> int:
  """The default token count: whitespace-separated words."""
  return len(text.split())


def _trim_blank(text: str) -> str:
  """Drops leading blank lines (keeping the first line's indent) and trailing space."""
  return re.sub(r"\A(?:[ \t]*\n)+", "", text).rstrip()


def _tail_within(text: str, budget: int, count: Callable[[str], int]) -> str:
  """The longest tail of `text` with count <= budget, cut at a line start if any
  line-start tail fits, else at a word start."""

  def longest(starts: list[int]) -> str:
    lo, hi = 0, len(starts)  # first index whose tail fits is in [lo, hi]
    while lo < hi:
      mid = (lo + hi) // 2
      if count(text[starts[mid]:]) <= budget:
        hi = mid
      else:
        lo = mid + 1
    return text[starts[lo]:] if lo < len(starts) else ""

  tail = longest([0] + [m.end() for m in re.finditer(r"\n", text)
                        if m.end() < len(text)])
  if tail.strip():
    return tail
  return longest([0] + [m.end() for m in re.finditer(r"\s+", text)])


@dataclasses.dataclass(frozen=True)
class SectionOptions:
  """How documents become tasks.

  Attributes:
    context_budget: max tokens of title line + context + heading.
    min_target_chars: targets shorter than this (after trimming) are skipped.
    max_target_tokens: targets counting more tokens than this are skipped.
    min_block_chars: minimum size of a plain-text section.
    held_out_fraction: the fraction of documents (by hash) in "test".
    validation_fraction: the fraction of documents (by hash) in "validation";
      0 makes no such split.
  """

  context_budget: int = 1024
  min_target_chars: int = 20
  max_target_tokens: int = 512
  min_block_chars: int = 200
  held_out_fraction: float = 0.2
  validation_fraction: float = 0.0

  def __post_init__(self):
    if self.context_budget < 1:
      raise ValueError(f"context_budget={self.context_budget} must be >= 1")
    if self.min_target_chars < 1:
      raise ValueError(f"min_target_chars={self.min_target_chars} must be >= 1")
    if self.max_target_tokens < 1:
      raise ValueError(f"max_target_tokens={self.max_target_tokens} must be >= 1")
    if self.min_block_chars < 0:
      raise ValueError(f"min_block_chars={self.min_block_chars} must be >= 0")
    if not 0.0 <= self.held_out_fraction <= 1.0:
      raise ValueError(f"held_out_fraction={self.held_out_fraction} must be "
                       "in [0, 1]")
    if not 0.0 <= self.validation_fraction <= 1.0 - self.held_out_fraction:
      raise ValueError(f"validation_fraction={self.validation_fraction} must be in "
                       f"[0, 1 - held_out_fraction]")

  @property
  def splits(self) -> tuple[str, ...]:
    """The splits a build makes: SPLITS, without "validation" when its fraction is 0."""
    return SPLITS if self.validation_fraction else ("train", "test")


def split_of(doc_id: str, held_out_fraction: float, validation_fraction: float = 0.0) -> str:
  """"test", "validation" or "train" for a document, from a stable hash of its id."""
  h = int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big") % 10_000
  if h < held_out_fraction * 10_000:
    return "test"
  if h < (held_out_fraction + validation_fraction) * 10_000:
    return "validation"
  return "train"


def document_title(doc: Document, sections: Sequence[Section]) -> tuple[str, int]:
  """The title and the index of the section it came from (-1: the doc's name)."""
  for k, sec in enumerate(sections):
    if sec.kind == "heading" and doc.format in ("markdown", "rst"):
      return sec.title, k
    if sec.text.strip():
      break
  return doc.name, -1


def make_tasks(doc: Document, sections: Sequence[Section], *,
               options: SectionOptions = SectionOptions(),
               count_tokens: Callable[[str], int] = whitespace_tokens,
               stats: collections.Counter | None = None) -> list[Task]:
  """The section-prediction tasks of one split document (module docstring)."""
  stats = collections.Counter() if stats is None else stats
  title, title_section = document_title(doc, sections)
  counts = [count_tokens(s.text) for s in sections]
  tasks = []
  for i, sec in enumerate(sections):
    if i == 0 or sec.kind not in TARGET_KINDS:
      continue
    if not any(s.text.strip() for s in sections[:i]):
      continue
    target = _trim_blank(sec.body)
    if len(target) < options.min_target_chars:
      stats["targets_too_short"] += 1
      continue
    if count_tokens(target) > options.max_target_tokens:
      stats["targets_too_long"] += 1
      continue
    room = options.context_budget - count_tokens(f"{title}\n\n") - count_tokens(sec.heading)
    while True:
      first, head, context = _context(sections, counts, i, room, title, title_section,
                                      count_tokens)
      # A counter that is not additive (a BPE tokenizer merges across the
      # joins) can make the whole prompt longer than its parts: shrink the room
      # by the excess until the prompt itself fits.
      excess = count_tokens(head + context + sec.heading) - options.context_budget
      if excess <= 0 or not context.strip():
        break
      room -= excess
    if not context.strip():
      stats["over_budget"] += 1
      continue
    tasks.append(Task(
        id=f"{doc.id}#{i}", prompt=head + context + sec.heading, kind="section",
        reference=target,
        extra={"document": doc.id, "section": i, "heading": sec.title,
               "format": doc.format, "context_truncated": first > 0}))
  return tasks


def _context(sections: Sequence[Section], counts: Sequence[int], i: int, room: int,
             title: str, title_section: int,
             count_tokens: Callable[[str], int]) -> tuple[int, str, str]:
  """(first section used, title line, context) of section i's prompt within `room`."""
  first, used = i, 0
  while first > 0 and used + counts[first - 1] <= room:
    used += counts[first - 1]
    first -= 1
  if first < i:
    context = "".join(s.text for s in sections[first:i])
  else:
    context = _tail_within(sections[i - 1].text, max(room, 0), count_tokens)
  # Only blank sections precede the title's heading, so the context already
  # opens with the title when it reaches back to that heading.
  head = "" if first < i and 0 <= title_section and first <= title_section else f"{title}\n\n"
  return first, head, context


def build_tasks(documents: Iterable[Document], *,
                options: SectionOptions = SectionOptions(),
                count_tokens: Callable[[str], int] = whitespace_tokens,
                stats: collections.Counter | None = None
                ) -> dict[str, list[Task]]:
  """Splits documents and makes tasks: {"train": [...], "test": [...]}, and
  "validation" when options.validation_fraction > 0.

  `stats` (a Counter, updated in place) receives documents, sections and tasks
  per split, and the counts of everything skipped.
  """
  stats = collections.Counter() if stats is None else stats
  splits: dict[str, list[Task]] = {name: [] for name in options.splits}
  for doc in documents:
    sections, fell_back = split_document(doc, options.min_block_chars)
    stats["python_syntax_fallback"] += fell_back
    split = split_of(doc.id, options.held_out_fraction, options.validation_fraction)
    tasks = make_tasks(doc, sections, options=options, count_tokens=count_tokens,
                       stats=stats)
    stats["documents"] += 1
    stats[f"documents_{split}"] += 1
    stats[f"sections_{split}"] += len(sections)
    stats[f"tasks_{split}"] += len(tasks)
    if len(sections) == 1:
      stats["single_section_documents"] += 1
    elif not tasks:
      stats["documents_without_tasks"] += 1
    splits[split].extend(tasks)
  return splits
