"""The errors a user can fix (bad input, missing set-up), told apart from bugs.

The command line prints a `UserError` as one line and exits with status 2; anything else is a bug
and keeps its traceback. Each kind also derives from the built-in type callers already catch
(`ValueError` for bad input, `RuntimeError` for the set-up), so library code stays compatible.
"""
from __future__ import annotations


class UserError(Exception):
    """Something the user can fix; the message says what and how, in one line."""


class InputError(UserError, ValueError):
    """A bad argument, file or value given by the user."""


class SetupError(UserError, RuntimeError):
    """A missing or unusable installation piece (weights, the BFCL checker, a device)."""
