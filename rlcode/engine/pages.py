"""The page pool's bookkeeping on the host: free pages, reference counts, the prefix cache.

Every page of the device pools (rlcode.models.paged) is in exactly one of three states:

  free        on the free list, holding nothing anyone will read
  referenced  held by one or more live sequences (a group's prompt pages by its G rows)
  cached      held by no sequence, but registered under the hash of the token blocks it
              holds: a later prompt that starts with the same blocks takes it back instead
              of recomputing it; cached pages are evicted least recently used first when
              the free list runs dry

A block's key chains the keys of the blocks before it (blake2b over the parent's digest and
the block's tokens), so a page is only ever matched at the same position after the same
prefix. Page 0 is scratch (SCRATCH_PAGE): never handed out.

This module must not know about devices, models or requests.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Sequence

import numpy as np

from rlcode.models.paged import SCRATCH_PAGE


# A pool of n pages is allocated as the next of 2**POOL_SIZE_BITS sizes per power of two.
POOL_SIZE_BITS = 4


def pool_pages(n: int) -> int:
  """The pool allocated for `n` pages: n rounded up to one of 16 sizes per power of two (at
  most 1/16 more; 16 at least). The pool's shape is every engine program's:
  batches that need a few pages more or less share one size, so a run of them compiles
  each program once rather than once a batch."""
  n = max(int(n), 16)
  step = 1 << max(n.bit_length() - 1 - POOL_SIZE_BITS, 0)
  return -(-n // step) * step


def block_keys(tokens: Sequence[int], page_size: int) -> list[bytes]:
  """The chained keys of `tokens`' full blocks of `page_size`."""
  keys, parent = [], b""
  for start in range(0, len(tokens) - page_size + 1, page_size):
    block = np.asarray(tokens[start:start + page_size], np.int64).tobytes()
    parent = hashlib.blake2b(parent + block, digest_size=16).digest()
    keys.append(parent)
  return keys


class PagePool:
  """Which pages are free, referenced or cached (see the module docstring).

  Args:
    num_pages: pages in the device pools, the scratch page included.
    page_size: positions per page.
    prefix_cache: keep finished blocks for reuse (False: a page is free when released).
  """

  def __init__(self, num_pages: int, page_size: int, *, prefix_cache: bool = True):
    if num_pages < 2 or page_size < 1:
      raise ValueError(f"a page pool needs at least 2 pages (one is scratch) and a page size "
                       f"of at least 1; got num_pages={num_pages} page_size={page_size}")
    self.num_pages, self.page_size, self.prefix_cache = num_pages, page_size, prefix_cache
    self.refs = np.zeros(num_pages, np.int32)
    self.free: collections.deque[int] = collections.deque(
        p for p in range(num_pages) if p != SCRATCH_PAGE)
    self.evictable: collections.OrderedDict[int, None] = collections.OrderedDict()
    self.page_of: dict[bytes, int] = {}
    self.key_of: dict[int, bytes] = {}
    self.stats = {"lookups": 0, "hit_blocks": 0, "evictions": 0}

  def available(self) -> int:
    """Pages an allocation can get now: free ones and evictable cached ones."""
    return len(self.free) + len(self.evictable)

  def used(self) -> int:
    """Pages held by live sequences."""
    return int((self.refs > 0).sum())

  def allocate(self, n: int) -> list[int] | None:
    """`n` pages, each referenced once; None (and nothing taken) if there are not enough."""
    if n > self.available():
      return None
    pages = []
    for _ in range(n):
      if self.free:
        page = self.free.popleft()
      else:
        page, _ = self.evictable.popitem(last=False)
        del self.page_of[self.key_of.pop(page)]
        self.stats["evictions"] += 1
      self.refs[page] = 1
      pages.append(page)
    return pages

  def share(self, pages: Sequence[int]) -> None:
    """One more reference to each page (a cached one leaves the eviction order)."""
    for page in pages:
      if self.refs[page] == 0:
        self.evictable.pop(page)
      self.refs[page] += 1

  def release(self, pages: Sequence[int]) -> None:
    """One reference less to each page; a page nobody holds is cached if registered,
    else free."""
    for page in pages:
      if self.refs[page] <= 0:
        raise ValueError(f"page {page} released more often than it was taken")
      self.refs[page] -= 1
      if self.refs[page] == 0:
        if page in self.key_of:
          self.evictable[page] = None
        else:
          self.free.append(page)

  def lookup(self, tokens: Sequence[int], limit: int) -> list[int]:
    """The pages holding the longest cached run of `tokens`' first full blocks, at most
    `limit` of them (not yet referenced: `share` them to keep them)."""
    self.stats["lookups"] += 1
    if not self.prefix_cache or limit <= 0:
      return []
    pages = []
    for key in block_keys(tokens[:limit * self.page_size], self.page_size):
      page = self.page_of.get(key)
      if page is None:
        break
      pages.append(page)
    self.stats["hit_blocks"] += len(pages)
    for page in pages:  # a hit is a use: the least recently used are evicted first
      if page in self.evictable:
        self.evictable.move_to_end(page)
    return pages

  def register(self, tokens: Sequence[int], pages: Sequence[int]) -> None:
    """Records that `pages` hold `tokens`' full blocks, in order (a block already cached
    under another page keeps that page)."""
    if not self.prefix_cache:
      return
    for key, page in zip(block_keys(tokens, self.page_size), pages):
      if key in self.page_of or page in self.key_of:
        continue
      self.page_of[key] = page
      self.key_of[page] = key

  def clear_cache(self) -> None:
    """Forgets every cached block (new weights make their keys and values stale): cached
    pages become free, and referenced ones are no longer offered to later prompts."""
    for page in self.evictable:
      self.free.append(page)
    self.evictable.clear()
    self.page_of.clear()
    self.key_of.clear()
