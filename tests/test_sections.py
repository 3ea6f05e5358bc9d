"""Section splitters, task making, sources and bad inputs, the tfds builder."""

from __future__ import annotations

import collections
import sys

import pytest

from rlcode.data.extras import SectionExtra

from rlcode.data import sections as S
from rlcode.data.tasks import load_tasks

MD = """---
title: front matter
---
Intro line.

# Guide #

Welcome text.

```python
# not a heading
```

#hashtag is not a heading

Setext Title
============

Body one.

Second
line heading
------------

Body two.

- item
---

## Last ##
Final body.
"""

RST = """=========
 The Doc
=========

Intro paragraph.

Section A
---------

Text A.

----

Literal::

    Indented
    --------

Sub A.1
~~~~~~~
Text A.1 with a short underline below.

Not a title
===

Section B
---------

Text B.
"""

PY = '''"""Module docstring."""

import os

CONSTANT = 1


# Helper comment directly above.
@decorator
def helper(a,
           b):
    """Helper doc."""
    return a + b

x = helper(1, 2)

# Separated comment.

class Thing(Base):
    """A thing."""

    def method(self):
        return 1


def one_liner(): return 2
'''

TXT = "Short one.\n\nShort two.\n\n\nA longer block that is long enough.\n\nTail.\n"


def _view(sections):
  return [(s.kind, s.heading, s.title, s.body) for s in sections]


def test_markdown_atx_setext_fences_front_matter():
  assert _view(S.split_markdown(MD)) == [
      ("preamble", "", "", "---\ntitle: front matter\n---\nIntro line.\n\n"),
      ("heading", "# Guide #\n", "Guide",
       "\nWelcome text.\n\n```python\n# not a heading\n```\n\n"
       "#hashtag is not a heading\n\n"),
      ("heading", "Setext Title\n============\n", "Setext Title",
       "\nBody one.\n\n"),
      ("heading", "Second\nline heading\n------------\n", "Second line heading",
       "\nBody two.\n\n- item\n---\n\n"),
      ("heading", "## Last ##\n", "Last", "Final body.\n"),
  ]


def test_rst_titles_overline_transitions_literal_blocks():
  assert _view(S.split_rst(RST)) == [
      ("heading", "=========\n The Doc\n=========\n", "The Doc",
       "\nIntro paragraph.\n\n"),
      ("heading", "Section A\n---------\n", "Section A",
       "\nText A.\n\n----\n\nLiteral::\n\n    Indented\n    --------\n\n"),
      ("heading", "Sub A.1\n~~~~~~~\n", "Sub A.1",
       "Text A.1 with a short underline below.\n\nNot a title\n===\n\n"),
      ("heading", "Section B\n---------\n", "Section B", "\nText B.\n"),
  ]


def test_python_top_level_definitions():
  assert _view(S.split_python(PY)) == [
      ("preamble", "", "", '"""Module docstring."""\n\nimport os\n\nCONSTANT = 1\n\n\n'),
      ("heading", "# Helper comment directly above.\n@decorator\n"
       "def helper(a,\n           b):\n", "helper",
       '    """Helper doc."""\n    return a + b\n\n'),
      ("code", "", "", "x = helper(1, 2)\n\n# Separated comment.\n\n"),
      ("heading", "class Thing(Base):\n", "Thing",
       '    """A thing."""\n\n    def method(self):\n        return 1\n\n\n'),
      ("heading", "def one_liner(): return 2\n", "one_liner", ""),
  ]


def test_python_syntax_error_raises_and_document_falls_back_to_text():
  with pytest.raises(SyntaxError):
    S.split_python("def f(:\n  pass\n")
  doc = S.Document("d.py", "def f(:\n  pass\n", "python", "d.py")
  sections, fell_back = S.split_document(doc)
  assert fell_back and [s.kind for s in sections] == ["block"]


def test_text_blocks_merge_to_minimum():
  assert [s.body for s in S.split_text(TXT, min_block_chars=20)] == [
      "Short one.\n\nShort two.\n\n\n",
      "A longer block that is long enough.\n\nTail.\n",
  ]
  assert len(S.split_text(TXT, min_block_chars=0)) == 4


@pytest.mark.parametrize("split,text", [
    (S.split_markdown, MD), (S.split_rst, RST), (S.split_python, PY),
    (S.split_text, TXT), (S.split_python, "x = 1\n\x0c\ndef f():\n  return 1"),
])
def test_sections_concatenate_back_to_the_document(split, text):
  assert "".join(s.text for s in split(text)) == text


DOC = ("# Title\n\nIntro words here.\n\n## Alpha\n\nalpha body text is here\n\n"
       "## Beta\n\nbeta body text is here too\n")


def _tasks(budget, **kw):
  doc = S.Document("corpus/doc.md", DOC, "markdown", "corpus/doc.md")
  stats = collections.Counter()
  opts = S.SectionOptions(context_budget=budget, min_target_chars=5, **kw)
  tasks = S.make_tasks(doc, S.split_markdown(DOC), options=opts, stats=stats)
  return {t.id: t for t in tasks}, stats


def test_tasks_prompt_reference_and_title_not_repeated():
  tasks, stats = _tasks(1000)
  assert sorted(tasks) == ["corpus/doc.md#1", "corpus/doc.md#2"]
  t1, t2 = tasks["corpus/doc.md#1"], tasks["corpus/doc.md#2"]
  assert t1.prompt == "# Title\n\nIntro words here.\n\n## Alpha\n"
  assert t1.reference == "alpha body text is here"
  assert t2.prompt == DOC[:DOC.index("\nbeta body")]
  assert t2.reference == "beta body text is here too"
  assert t2.kind == "section"
  assert t2.extra == SectionExtra(document="corpus/doc.md", section=2, heading="Beta",
                                  format="markdown", context_truncated=False)
  assert not stats


def test_budget_drops_whole_sections_from_the_front():
  # Words: title line 1, "## Beta" 2, section Alpha 7, section Title 5.
  tasks, _ = _tasks(10)
  t2 = tasks["corpus/doc.md#2"]
  assert t2.prompt == "Title\n\n## Alpha\n\nalpha body text is here\n\n## Beta\n"
  assert t2.extra.context_truncated
  assert S.whitespace_tokens(t2.prompt) <= 10


def test_budget_cuts_the_nearest_section_at_a_line_then_a_word():
  tasks, _ = _tasks(8)
  assert (tasks["corpus/doc.md#2"].prompt
          == "Title\n\n\nalpha body text is here\n\n## Beta\n")
  tasks, _ = _tasks(6)
  assert tasks["corpus/doc.md#2"].prompt == "Title\n\ntext is here\n\n## Beta\n"


def test_budget_too_small_for_title_and_heading_is_counted():
  tasks, stats = _tasks(3)
  assert not tasks and stats["over_budget"] == 2


def test_target_length_filters_are_counted():
  tasks, stats = _tasks(1000, max_target_tokens=5)
  assert list(tasks) == ["corpus/doc.md#1"] and stats["targets_too_long"] == 1
  doc = S.Document("d", "# A\nintro\n# B\nx\n", "markdown", "d")
  stats = collections.Counter()
  assert not S.make_tasks(doc, S.split_markdown(doc.text), stats=stats)
  assert stats["targets_too_short"] == 1


def test_custom_token_counter_sets_the_budget():
  doc = S.Document("d", DOC, "markdown", "d")
  opts = S.SectionOptions(context_budget=60, min_target_chars=5)
  tasks = S.make_tasks(doc, S.split_markdown(DOC), options=opts, count_tokens=len)
  assert [len(t.prompt) <= 60 for t in tasks] == [True, True]
  assert tasks[1].prompt.endswith("alpha body text is here\n\n## Beta\n")


def test_split_is_stable_by_document():
  ids = [f"corpus/file{i}.md" for i in range(2000)]
  held = [S.split_of(i, 0.2) for i in ids]
  assert held == [S.split_of(i, 0.2) for i in ids]
  assert 0.17 < held.count("test") / len(ids) < 0.23
  assert {S.split_of(i, 0.0) for i in ids} == {"train"}
  assert {S.split_of(i, 1.0) for i in ids} == {"test"}


def _write_corpus(root):
  files = {
      "empty.md": b"",
      "blank.txt": b"  \n\n",
      "blob.py": b"\x00\x01binary",
      "latin.md": "Caf\u00e9\n# H\n".encode("latin-1"),
      "cookie.py": (b"# -*- coding: latin-1 -*-\n\"\"\"Caf\xe9.\"\"\"\n\n"
                    b"def f():\n    return 'long enough body here'\n"),
      "badcookie.py": b"# -*- coding: nonsense -*-\nx = 1\n",
      "image.png": b"\x89PNG\r\n",
      ".git/config.md": b"# hidden\n",
      "flat.md": b"No headings here, just text.\n",
      "broken.py": b"def f(:\n    pass\n\nmore text\n",
      "sub/good.md": (b"\xef\xbb\xbf# Good\r\n\r\nIntro.\r\n\r\n## Part\r\n\r\n"
                      b"A part body long enough.\r\n"),
  }
  for name, data in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_bad_inputs_are_skipped_and_counted(tmp_path):
  _write_corpus(tmp_path / "corpus")
  splits, counts = S.collect([str(tmp_path / "corpus")],
                             options=S.SectionOptions(held_out_fraction=0.0))
  assert {k: v for k, v in counts.items() if v} == {
      "documents": 4, "documents_train": 4, "sections_train": 6,
      "tasks_train": 2, "single_section_documents": 2,
      "python_syntax_fallback": 1, "skipped_binary": 1,
      "skipped_undecodable": 2, "skipped_empty": 2, "skipped_hidden": 1,
      "skipped_suffix": 1,
  }
  by_id = {t.id: t for t in splits["train"]}
  assert sorted(by_id) == ["corpus/cookie.py#1", "corpus/sub/good.md#1"]
  assert by_id["corpus/cookie.py#1"].prompt.startswith(
      'corpus/cookie.py\n\n# -*- coding: latin-1 -*-\n"""Caf\u00e9."""')
  assert by_id["corpus/sub/good.md#1"].prompt == "# Good\n\nIntro.\n\n## Part\n"
  assert by_id["corpus/sub/good.md#1"].reference == "A part body long enough."


def test_bad_sources_raise(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope"):
    S.read_documents([str(tmp_path / "nope")])
  with pytest.raises(TypeError, match="sequence of paths"):
    S.read_documents(str(tmp_path))
  for d in ("a", "b"):
    (tmp_path / d / "x").mkdir(parents=True)
    (tmp_path / d / "x" / "f.md").write_text("# T\n")
  with pytest.raises(ValueError, match="document id 'x/f.md'"):
    S.read_documents([str(tmp_path / "a" / "x"), str(tmp_path / "b" / "x")])
  with pytest.raises(ValueError, match="held_out_fraction"):
    S.SectionOptions(held_out_fraction=1.5)


def test_builder_round_trip_and_counts(tmp_path):
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  for i in range(6):
    (corpus / f"doc{i}.md").write_text(
        f"# Doc {i}\n\nIntro {i}.\n\n## Part\n\nThe body of part {i} is here.\n")
  opts = S.SectionOptions(held_out_fraction=0.5)
  want, counts = S.collect([str(corpus)], options=opts)
  assert counts["tasks_train"] and counts["tasks_test"]
  builder = S.SectionTasks(data_dir=str(tmp_path / "tfds"), sources=[str(corpus)],
                           options=opts)
  for split in opts.splits:
    assert load_tasks(builder, split) == sorted(want[split], key=lambda t: t.id)
  reloaded = S.SectionTasks(data_dir=str(tmp_path / "tfds"), sources=[str(corpus)],
                            options=opts)
  assert reloaded.counts == counts
  other = S.SectionTasks(data_dir=str(tmp_path / "tfds"), sources=[str(corpus)],
                         options=opts, count_tokens=len, count_tokens_name="chars")
  assert other.builder_config.name != builder.builder_config.name
  with pytest.raises(ValueError, match="count_tokens_name"):
    S.SectionTasks(data_dir=str(tmp_path), count_tokens=len)
  empty_test = S.SectionTasks(data_dir=str(tmp_path / "tfds"), sources=[str(corpus)],
                              options=S.SectionOptions(held_out_fraction=0.0))
  with pytest.raises(ValueError, match="split 'test' has no tasks"):
    empty_test.download_and_prepare()


# Counts of the embedded corpus (default options) per Python release, measured
# with this code; stdlib sources and pydoc topics differ between releases, the
# bundles' documents (34 of them, 144 train and 77 test tasks) do not.
EMBEDDED_COUNTS = {
    (3, 11, 7): {"documents": 152, "documents_train": 120, "documents_test": 32,
                 "sections_train": 1148, "sections_test": 177, "tasks_train": 789,
                 "tasks_test": 125, "single_section_documents": 77,
                 "documents_without_tasks": 3, "targets_too_short": 56,
                 "targets_too_long": 55},
    (3, 12, 1): {"documents": 152, "documents_train": 120, "documents_test": 32,
                 "sections_train": 1166, "sections_test": 185, "tasks_train": 808,
                 "tasks_test": 130, "single_section_documents": 76,
                 "documents_without_tasks": 3, "targets_too_short": 56,
                 "targets_too_long": 56},
    (3, 13, 0): {"documents": 152, "documents_train": 120, "documents_test": 32,
                 "sections_train": 1193, "sections_test": 188, "tasks_train": 829,
                 "tasks_test": 132, "single_section_documents": 75,
                 "documents_without_tasks": 3, "targets_too_short": 53,
                 "targets_too_long": 58},
}


def test_embedded_corpus_builds_with_stable_counts(tmp_path):
  builder = S.SectionTasks(data_dir=str(tmp_path))
  test_tasks = load_tasks(builder, "test")
  counts = builder.counts
  assert counts["tasks_test"] == len(test_tasks)
  # 79 pydoc topics, the stdlib modules, and the .md/.rst files of the bundles
  # outside hidden directories (`git ls-files` at their heads: attrs 27, more-itertools 7).
  assert counts["documents"] == 79 + len(S.STDLIB_MODULES) + 27 + 7
  assert all(t.kind == "section" and t.reference for t in test_tasks)
  assert {t.extra.format for t in test_tasks} <= {"rst", "python", "markdown"}
  skipped = {k: v for k, v in counts.items() if k.startswith("skipped")}
  assert skipped == dict.fromkeys(skipped, 0)
  assert counts["python_syntax_fallback"] == 0 and counts["over_budget"] == 0
  want = EMBEDDED_COUNTS.get(tuple(sys.version_info[:3]))
  if want is not None:
    assert {k: v for k, v in counts.items() if v} == want
