"""Trains data/code_bpe.json, a byte-level BPE for code, on what is here; reports its compression.

    PYTHONPATH=. python data/make_tokenizer.py          # ~3 minutes on 2 cores

The tokenizer (the `tokenizers` library, tokenizer.json format, loaded by
rlcode.models.tokenizer.load_tokenizer): byte-level pre-tokenization and
decoding (GPT-2's), so every text round-trips (but the special tokens' own
spellings, which encode as those tokens); BPE merges up to a vocabulary of 4096
with <|pad|>, <|bos|>, <|eos|> as ids 0, 1, 2; encoding prepends <|bos|>, as the
byte tokenizer does its BOS.

Training text, all local:
- the .py sources of this interpreter's standard library (sysconfig's
  "stdlib", without site-packages), except the files in HELD_OUT_STDLIB;
- each bundle of data/repos (attrs, more-itertools) at the end of its
  training split: the text files of the tree of its last first-parent commit
  before the miner's test cutoff (rlcode.data.git.mine with the default
  MiningConfig: the latest 10% of kept PRs are held out).
Nothing of a bundle's test split is trained on. Compression (tokens per byte,
without <|bos|>; the byte tokenizer's is 1.0) is measured on three held-out
sets: HELD_OUT_STDLIB; the bundles' test-split files (the files the test PRs
touch, as they are at the head; earlier versions of these files are in the
training trees, so this set flatters the tokenizer); and the lines the test
PRs add (new text only).

Result (Python 3.11.7; 3 minutes on 2 shared cores), printed by this script:

| text | files | bytes | tokens | tokens/byte | bytes/token |
|---|---:|---:|---:|---:|---:|
| training text (for reference) | 1904 | 32573485 | 9726235 | 0.299 | 3.35 |
| stdlib, held-out modules | 8 | 373916 | 105923 | 0.283 | 3.53 |
| bundles' test-split files | 79 | 1336878 | 415213 | 0.311 | 3.22 |
| lines the test PRs add | 2 | 229486 | 106426 | 0.464 | 2.16 |
"""

from __future__ import annotations

import argparse
import os
import sysconfig

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from rlcode.data import edits
from rlcode.data.git import MiningConfig, checkout, mine
from rlcode.data.git.repo import Git

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLES = ("data/repos/attrs.bundle", "data/repos/more-itertools.bundle")
# Added tokens match their text wherever it occurs, so they are spelled as code
# and prose almost never are.
SPECIAL = ("<|pad|>", "<|bos|>", "<|eos|>")
HELD_OUT_STDLIB = ("argparse.py", "difflib.py", "fractions.py", "textwrap.py", "statistics.py",
                   "json/decoder.py", "email/message.py", "asyncio/tasks.py")
TEXT_SUFFIXES = (".py", ".pyi", ".rst", ".md", ".txt", ".toml", ".cfg", ".ini", ".yml", ".yaml")
MAX_FILE_BYTES = 1 << 20


def _text(data: bytes) -> str | None:
  if b"\0" in data or len(data) > MAX_FILE_BYTES:
    return None
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    return None


def stdlib_files() -> tuple[list[str], list[str]]:
  """(training texts, held-out texts) of the standard library's .py files."""
  root = sysconfig.get_paths()["stdlib"]
  train, held = [], []
  for folder, dirs, names in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d != "site-packages" and not d.startswith("."))
    for name in sorted(names):
      if not name.endswith(".py"):
        continue
      path = os.path.join(folder, name)
      with open(path, "rb") as f:
        text = _text(f.read())
      if text is not None:
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        (held if rel in HELD_OUT_STDLIB else train).append(text)
  return train, held


def bundle_files(bundle: str) -> tuple[list[str], list[str], list[str]]:
  """(training tree texts, test-split file texts, lines the test PRs add) of a bundle."""
  result = mine(MiningConfig(source=bundle), progress=True)
  cutoff = result.report["split"]["cutoff_time"]
  git = Git(checkout(bundle))
  head = result.report["head"]
  log = git.first_parent_log(head, 0)
  last_train = [c.sha for c in log if c.time < cutoff][-1]

  def texts(commit: str, paths=None) -> list[str]:
    out = []
    with git.blobs() as blobs:
      for mode, sha, path, _ in git.tree_files(commit, recursive=True):
        if mode in ("100644", "100755") and path.endswith(TEXT_SUFFIXES) and (
            paths is None or path in paths):
          text = _text(blobs.read(sha) or b"")
          if text is not None:
            out.append(text)
    return out

  tests = result.splits["test"]
  touched = {p for t in tests for p in t.extra["oracle"]}
  added = []
  for t in tests:
    for path, new in t.extra["oracle"].items():
      patch = edits.normalized_patch(t.extra["files"][path], new)
      added += [line[1:] + "\n" for line in patch.splitlines()
                if line.startswith("+") and not line.startswith("+++")]
  return texts(last_train), texts(head, touched), ["".join(added)]


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                special_tokens=list(SPECIAL), show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
  tok.post_processor = processors.TemplateProcessing(
      single="<|bos|> $A", special_tokens=[("<|bos|>", tok.token_to_id("<|bos|>"))])
  return tok


def compression(tok: Tokenizer, texts: list[str]) -> tuple[int, int, int]:
  """(files, bytes, tokens without <|bos|>) of `texts`."""
  n_bytes = sum(len(t.encode()) for t in texts)
  n_tokens = sum(len(e.ids) - 1 for e in tok.encode_batch(texts))
  return len(texts), n_bytes, n_tokens


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--vocab", type=int, default=4096)
  parser.add_argument("--out", default=os.path.join(ROOT, "data", "code_bpe.json"))
  args = parser.parse_args(argv)
  train, held_stdlib = stdlib_files()
  held_files, held_added = [], []
  for bundle in BUNDLES:
    tree, files, added = bundle_files(os.path.join(ROOT, bundle))
    train += tree
    held_files += files
    held_added += added
  tok = train_tokenizer(train, args.vocab)
  for text in held_stdlib + held_files:
    if tok.decode(tok.encode(text).ids) != text:
      raise RuntimeError("the tokenizer does not round-trip a held-out file")
  tok.save(args.out)
  rows = [("training text (for reference)", train), ("stdlib, held-out modules", held_stdlib),
          ("bundles' test-split files", held_files), ("lines the test PRs add", held_added)]
  print(f"{args.out}: vocabulary {tok.get_vocab_size()}")
  for name, texts in rows:
    files, n_bytes, n_tokens = compression(tok, texts)
    print(f"| {name} | {files} | {n_bytes} | {n_tokens} | {n_tokens / n_bytes:.3f} "
          f"| {n_bytes / n_tokens:.2f} |")


if __name__ == "__main__":
  main()
