"""Markdown tables as the experiments print them: `| a | b |` rows under a rule of
`---` (left) and `---:` (right) cells."""

from __future__ import annotations


def row(cells) -> str:
  """One table row; an empty cell is printed `| |`."""
  return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"


def rule(align: str) -> str:
  """The rule under a header: one "l" (---) or "r" (---:) a column."""
  return "|" + "|".join({"l": "---", "r": "---:"}[a] for a in align) + "|"


def markdown(header, rows, align: str) -> str:
  """A whole table: the header's cells, the rule of `align`, then the rows' cells."""
  return "\n".join([row(header), rule(align), *(row(r) for r in rows)])


def pm(mean: float, se: float, digits: int = 3) -> str:
  """`mean ± se` at `digits` decimals."""
  return f"{mean:.{digits}f} ± {se:.{digits}f}"


def gains(summary: dict, seeds: int) -> str:
  """One line a gain of `summary` (its name -> (mean, standard error)), signed at 3
  decimals, the standard error over `seeds` seeds said."""
  return "\n".join(f"{name}: {m:+.3f} ± {se:.3f} (mean ± standard error over {seeds} seeds)"
                   for name, (m, se) in summary.items())
