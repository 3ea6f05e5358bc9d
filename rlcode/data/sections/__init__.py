"""Whole-section prediction tasks: documents split into sections, next section as target.

    from rlcode.data import sections
    splits, counts = sections.collect()          # the embedded corpus
    builder = sections.SectionTasks(data_dir=..., sources=("docs/",))

The rooms:
  splitters.py  Markdown, reStructuredText, Python and plain text into Sections
  tasks.py      sections into tasks (context budget, title), the split by document
  corpus.py     documents from files, directories, gs:// and the embedded corpus
  builder.py    the tfds builder (SectionTasks)

Nothing here tokenizes for a model or touches rewards; it only makes Tasks.
"""

from rlcode.data.sections.builder import SectionsConfig, SectionTasks
from rlcode.data.sections.corpus import (COUNT_KEYS, STDLIB_MODULES, SUFFIX_FORMATS, collect,
                                         decode_document, embedded_documents, read_documents)
from rlcode.data.sections.splitters import (FORMATS, TARGET_KINDS, Document, Section,
                                            split_document, split_markdown, split_python,
                                            split_rst, split_text)
from rlcode.data.sections.tasks import (SPLITS, SectionOptions, build_tasks, document_title,
                                        make_tasks, split_of, whitespace_tokens)

__all__ = [
    "COUNT_KEYS", "FORMATS", "SPLITS", "STDLIB_MODULES", "SUFFIX_FORMATS", "TARGET_KINDS",
    "Document", "Section", "SectionOptions", "SectionTasks", "SectionsConfig", "build_tasks",
    "collect", "decode_document", "document_title", "embedded_documents", "make_tasks",
    "read_documents", "split_document", "split_markdown", "split_of", "split_python",
    "split_rst", "split_text", "whitespace_tokens",
]
