"""Errors in what a user gave us, as opposed to bugs.

A config key that does not exist, a checkpoint that is not there, a malformed line in
a JSON-lines file, a flag that does not parse: each raises a `UserError` whose message
names the input and what was wrong with it. The CLI prints that message as one line
on stderr and exits 2; any other exception is a bug and keeps its traceback.

The concrete classes also derive from the builtin a caller would expect
(`ValueError`, `KeyError`, `FileNotFoundError`), so library code and tests can catch
them the usual way.
"""

from __future__ import annotations


class UserError(Exception):
  """An error in the user's input; its message is the whole story."""

  @property
  def message(self) -> str:
    return str(self.args[0]) if self.args else type(self).__name__


class BadInput(UserError, ValueError):
  """A value, flag, file content or combination of settings that is wrong."""


class UnknownKey(UserError, KeyError):
  """A config key or a name that does not exist; the message names the valid ones."""

  def __str__(self) -> str:  # KeyError would quote the message
    return self.message


class MissingInput(UserError, FileNotFoundError):
  """A file, directory or checkpoint that should exist and does not."""

  def __str__(self) -> str:
    return self.message
