"""The tfds builder of section-prediction tasks; its cache name hashes every argument.

This module must not split or read documents itself (rlcode.data.sections.corpus).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow_datasets as tfds

from rlcode.data.sections.corpus import bundle_heads, collect
from rlcode.data.sections.tasks import SectionOptions, whitespace_tokens
from rlcode.data.tasks import LocalDatasetInfo, TaskBuilder

@dataclasses.dataclass(eq=False)
class SectionsConfig(tfds.core.BuilderConfig):
  """The arguments of a SectionTasks build (its name keys the tfds cache)."""

  sources: tuple[str, ...] = ()
  options: SectionOptions = SectionOptions()
  count_tokens_name: str = "words"


class SectionTasks(TaskBuilder):
  """Whole-section prediction tasks from Markdown, RST, Python and text documents."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, data_dir: str, sources: Sequence[str] = (),
               options: SectionOptions = SectionOptions(),
               count_tokens: Callable[[str], int] | None = None,
               count_tokens_name: str | None = None, **kwargs):
    """Makes the builder; its cache name is a hash of all arguments.

    Args:
      data_dir: where tfds writes the dataset.
      sources: local or gs:// files and directories; empty means the embedded
        corpus (pydoc topics and STDLIB_MODULES of the running Python, and the
        documentation of the BUNDLE_DOCS; the Python version and the bundles'
        heads are part of the cache name).
      options: SectionOptions.
      count_tokens: text -> token count for the budgets; None counts
        whitespace-separated words.
      count_tokens_name: required with `count_tokens`: names the tokenizer in
        the cache key, so builds with different tokenizers never share a cache.
      **kwargs: passed to tfds.
    """
    if isinstance(sources, str):
      raise TypeError(f"sources must be a sequence of paths, got the string "
                      f"{sources!r}")
    if count_tokens is not None and not count_tokens_name:
      raise ValueError("count_tokens needs count_tokens_name (it keys the cache)")
    self._count_tokens = count_tokens or whitespace_tokens
    count_name = count_tokens_name if count_tokens is not None else "words"
    key = json.dumps({"sources": list(sources), "count_tokens": count_name,
                      "options": dataclasses.asdict(options),
                      "python": "" if sources else sys.version.split()[0],
                      "bundles": {} if sources else bundle_heads()},
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    config = SectionsConfig(
        name=f"{'sources' if sources else 'embedded'}_{digest}",
        description=key, sources=tuple(sources), options=options,
        count_tokens_name=count_name)
    super().__init__(data_dir=data_dir, config=config, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    base = super()._info()
    # The build's counts travel with the dataset (metadata.json).
    return LocalDatasetInfo(builder=self, description=base.description,
                                 features=base.features,
                                 metadata=tfds.core.MetadataDict())

  def _split_tasks(self) -> Mapping[str, Any]:
    config: SectionsConfig = self.builder_config
    splits, counts = collect(config.sources, options=config.options,
                             count_tokens=self._count_tokens)
    for name, tasks in splits.items():
      if not tasks:
        raise ValueError(f"{self.name}: split {name!r} has no tasks (counts "
                         f"{counts}); add documents or change held_out_fraction")
    self.info.metadata["counts"] = counts
    return splits

  @property
  def counts(self) -> dict[str, int]:
    """The counts (COUNT_KEYS) of the build, read back from the dataset."""
    return dict(self.info.metadata["counts"])
