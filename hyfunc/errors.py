"""The errors a user can fix (bad input, missing set-up), told apart from bugs.

The command line prints a `UserError` as one line and exits with status 2; anything else is a bug
and keeps its traceback. Each kind also derives from the built-in type callers already catch
(`ValueError` for bad input, `RuntimeError` for the set-up), so library code stays compatible.
"""
from __future__ import annotations

import importlib
from types import ModuleType


class UserError(Exception):
    """Something the user can fix; the message says what and how, in one line."""


class InputError(UserError, ValueError):
    """A bad argument, file or value given by the user."""


class SetupError(UserError, RuntimeError):
    """A missing or unusable installation piece (weights, the BFCL checker, a device)."""


def require_extra(module: str, extra: str, purpose: str) -> ModuleType:
    """Import `module`, an optional dependency; missing, it is a SetupError naming the extra that
    installs it, so a command fails in one line before it loads any model."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise SetupError(f"{purpose} needs {err.name or module}, which is not installed: "
                         f"pip install 'hyfunc[{extra}]'") from None
