"""The `hyfunc` command line.

parsers.py defines every option; each command's handler ("module:function") is imported only when
the command runs, so building the parser and `hyfunc --help` load no model code.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable

from hyfunc.cli.checks import check_input_paths, one_line
from hyfunc.cli.parsers import build_parser
from hyfunc.errors import UserError, require_extra

#: Errors that are the user's to fix: printed as one line, exit status 2. Anything else is a bug
#: and keeps its traceback. A missing file named on the command line is the user's too.
USER_ERRORS = (UserError, FileNotFoundError)


def handler(spec: str) -> Callable[[argparse.Namespace], int]:
    """The function a "module:function" spec names, its module imported now."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_input_paths(args)
        for module, extra in getattr(args, "needs", ()):
            require_extra(module, extra, f"hyfunc {args.command}")
        return handler(args.handler)(args)
    except USER_ERRORS as err:
        # The one place that turns an error the user can fix into one line (see hyfunc/errors.py).
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        return 2
