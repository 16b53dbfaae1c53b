"""Checks the command line runs before it loads any model, and the printed forms of an answer.

Loading the default models takes a minute or more; a typo found after that wastes it. So every
input that can be checked without a model (categories, data folders, the BFCL checker's install,
the device, options that do not apply to the chosen method) is checked first, and each failure is
a `UserError` with one line that says what to do.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

from hyfunc.cascade.manifest import MANIFEST
from hyfunc.data import TOOL_LIBRARY
from hyfunc.errors import InputError
from hyfunc.formats.bfcl import canonical_category, is_multi_turn_category
from hyfunc.formats.calls import (
    render_python_calls,
    to_bfcl_output,
    to_openai_tool_calls,
)
from hyfunc.methods.base import Answer
from hyfunc.models.engines import check_engine
from hyfunc.models.registry import DEFAULT_LARGE, check_model_name

CALL_FORMATS = ("json", "openai", "python")

#: Options of `parsers._add_method_args` (and `eval bfcl`) that only one method reads: option -> method.
#: Their argparse defaults are "not given" (None or empty), so a value here means the user typed it.
_METHOD_ONLY = {
    "model": ("--model", "direct", "the cascade's models are those of its --artifact"),
    "style": ("--style", "direct", "the cascade's prompts are fixed by its training"),
    "artifact": ("--artifact", "hyfunc", "direct prompting has no trained parts"),
    "ablate": ("--ablate", "hyfunc", "direct prompting has no stages to switch off"),
    "ablations": ("--ablations", "hyfunc", "direct prompting has no stages to switch off"),
    "with_cascade": ("--with-cascade", "hyfunc", "the cascades share the main cascade's large model"),
    "small_engine": ("--small-engine", "hyfunc", "direct prompting has no small model"),
}


#: Options that name input files or directories: option -> (flag, how to get such data).
_INPUT_PATHS = {
    "data": ("--data", "the bundled training data is the default (omit --data), or give JSON Lines files of "
             "query/tools/answers"),
    "library": ("--library", f"give JSON Lines of tool schemas or a directory of them (the bundled Seal-Tools "
                f"library: {TOOL_LIBRARY})"),
}


def check_input_paths(args: argparse.Namespace) -> None:
    """Every `--data` and `--library` path exists; a typo fails now, not after the models load."""
    for attr, (flag, how) in _INPUT_PATHS.items():
        value = getattr(args, attr, None)
        for path in [value] if isinstance(value, str) else value or []:
            if not Path(path).exists():
                raise InputError(f"{flag} {path}: no such file or directory; {how}")


def split_engine_spec(spec: str) -> tuple[str, list[str]]:
    """"name@engine" or "artifact@large,small" -> (name, [engines]) with each engine checked."""
    name, _, engines = spec.partition("@")
    return name, [check_engine(e) for e in engines.split(",")] if engines else []


def check_method_options(args: argparse.Namespace) -> None:
    """Refuse an option the chosen method would silently ignore; then `check_loadable` on what
    the command will load."""
    for attr, (flag, method, why) in _METHOD_ONLY.items():
        if getattr(args, attr, None) and args.method != method:
            raise InputError(f"{flag} applies to --method {method} only ({why}); drop it or use --method {method}")
    models = [args.model or DEFAULT_LARGE] if args.method == "direct" else []
    artifacts = [args.artifact] if args.method == "hyfunc" and args.artifact else []
    models += [split_engine_spec(spec)[0] for spec in getattr(args, "with_direct", None) or []]
    for spec in getattr(args, "with_cascade", None) or []:
        artifact = split_engine_spec(spec)[0]
        if artifact != "shipped":  # the shipped cascade is always there
            artifacts.append(artifact)
    check_loadable(models, artifacts, getattr(args, "device", None))


def check_loadable(models: Sequence[str], artifacts: Sequence[str], device: str | None) -> None:
    """By name and path only (nothing loads): the model names resolve, the artifacts are prepared
    cascades, the device exists."""
    if device is not None:
        from hyfunc.models.backend import resolve_device

        resolve_device(device)
    for name in models:
        check_model_name(name)
    for artifact in artifacts:
        if not (Path(artifact) / MANIFEST).is_file():
            raise InputError(f"{artifact}: no {MANIFEST}; not a prepared cascade (run `hyfunc prepare`)")


def check_bfcl_inputs(categories: Sequence[str], data_dir: str | None) -> list[str]:
    """The canonical categories, once their question files are found and the checker imports."""
    from hyfunc.eval.bfcl import data_files
    from hyfunc.formats.bfcl import official_ast_checker

    categories = [canonical_category(c) for c in categories]
    if data_dir is not None:
        folder = Path(data_dir)
        if not folder.is_dir():
            raise InputError(f"--data-dir {data_dir!r} is not a directory")
        if not any(folder.glob("*.json")):
            raise InputError(
                f"--data-dir {data_dir!r} holds no .json question file (BFCL's layout: "
                "<prefix>_<category>.json question files and possible_answer/ beside them)"
            )
    for category in categories:
        if data_dir is not None and is_multi_turn_category(category):
            raise InputError(f"--data-dir holds single-turn categories only; {category} is read from bfcl-eval's "
                             "packaged data (its simulated APIs go with it)")
        data_files(category, data_dir)  # raises with the folder and the category when one is missing
    official_ast_checker()  # a missing or broken bfcl-eval shows now, not after the models load
    return categories


def format_answer(answer: Answer, fmt: str) -> str:
    """`answer` as `hyfunc call` prints it (see CALL_FORMATS)."""
    if fmt == "json":
        return json.dumps({"calls": to_bfcl_output(answer.calls), "error": answer.error}, ensure_ascii=False)
    if fmt == "openai":
        # The assistant message of an OpenAI chat completion: tool_calls, or text when no tool fits.
        message: dict = {"role": "assistant", "content": None if answer.calls else answer.raw_text.strip()}
        if answer.calls:
            message["tool_calls"] = to_openai_tool_calls(answer.calls)
        return json.dumps(message, ensure_ascii=False)
    if fmt == "python":
        try:
            return render_python_calls(answer.calls)
        except ValueError as err:  # tool or argument names that are not Python identifiers
            raise InputError(f"these calls have no python form ({err}); use --format json or openai") from None
    raise InputError(f"unknown format {fmt!r}; choose one of {', '.join(CALL_FORMATS)}")


def one_line(text: str) -> str:
    """`text` on one line: the command line promises one line per error."""
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())
