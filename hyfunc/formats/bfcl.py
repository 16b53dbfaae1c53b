"""The official `bfcl-eval` package, imported lean, and the prompt it gives prompting models.

BFCL's prompt is how direct prompting shows tools to a model, so it lives beside the other
formats rather than in the evaluation. Install (lean, no torch, see requirements/bfcl.txt)::

    pip install --no-deps bfcl-eval==2026.3.23
    pip install -r requirements/bfcl.txt

Importing bfcl_eval creates ``result/``, ``score/`` and ``.file_locks/`` under its "project root",
which defaults to site-packages. We point it (unless the user already did) at
``$HYFUNC_HOME/bfcl`` (default ``~/.cache/hyfunc/bfcl``) through ``BFCL_PROJECT_ROOT`` before the
first import. No ``.env`` file is read: only bfcl_eval's CLI entry points load one.
"""
from __future__ import annotations

import copy
import importlib
import os
from typing import Any, Iterable, Sequence

from hyfunc.config import hyfunc_home
from hyfunc.errors import SetupError

BFCL_EVAL_VERSION_TESTED = "2026.3.23"

# One line: the command line prints errors as a single line.
INSTALL_HINT = (
    "the official BFCL checker (bfcl-eval) is not installed; install it with: "
    f"pip install --no-deps bfcl-eval=={BFCL_EVAL_VERSION_TESTED} && pip install -r requirements/bfcl.txt"
)


class BfclError(SetupError):
    """Missing checker, missing data files, or a malformed data set."""


# ---------------------------------------------------------------------------------------------
# Categories: the one list the loader (hyfunc.eval.bfcl) and the command line both use

#: The single-turn Python categories scored by `run_eval` by default.
CATEGORIES: list[str] = [
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
]
#: BFCL's multi-turn categories: conversations over simulated APIs (hyfunc.eval.bfcl_multi_turn).
MULTI_TURN_CATEGORIES: list[str] = [
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
]
#: Also accepted: BFCL's relevance category (a call is expected, any call counts), and the multi-turn ones.
EXTRA_CATEGORIES: list[str] = ["live_relevance", *MULTI_TURN_CATEGORIES]
#: Old (BFCL v3) names.
ALIASES: dict[str, str] = {"simple": "simple_python"}


def is_multi_turn_category(category: str) -> bool:
    return category in MULTI_TURN_CATEGORIES


def canonical_category(category: str) -> str:
    category = ALIASES.get(category, category)
    if category not in CATEGORIES and category not in EXTRA_CATEGORIES:
        raise BfclError(
            f"unsupported BFCL category {category!r}; supported: {', '.join(CATEGORIES + EXTRA_CATEGORIES)}"
        )
    return category


# ---------------------------------------------------------------------------------------------
# Importing bfcl_eval


def _prepare_bfcl_env() -> None:
    if "BFCL_PROJECT_ROOT" not in os.environ:
        root = hyfunc_home() / "bfcl"
        root.mkdir(parents=True, exist_ok=True)
        os.environ["BFCL_PROJECT_ROOT"] = str(root)


def import_bfcl(module: str):
    _prepare_bfcl_env()
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise BfclError(f"{INSTALL_HINT} (import of {module} failed: {e})") from e


def bfcl_eval_version() -> str:
    try:
        from importlib.metadata import version

        return version("bfcl-eval")
    except Exception:  # pragma: no cover - not installed
        return "not installed"


def official_ast_checker():
    return import_bfcl("bfcl_eval.eval_checker.ast_eval.ast_checker").ast_checker


def bfcl_utils():
    return import_bfcl("bfcl_eval.utils")


def _bfcl_model_utils():
    return import_bfcl("bfcl_eval.model_handler.utils")


def _as_docs(functions: Iterable[Any]) -> list[dict]:
    docs = []
    for f in functions:
        if hasattr(f, "to_bfcl"):
            docs.append(f.to_bfcl())
        else:
            docs.append(copy.deepcopy(dict(f)))
    return docs


def bfcl_system_prompt(functions: Iterable[Any], category: str = "simple_python", language_hint: bool = True) -> str:
    """BFCL's default system prompt for prompting models, built by bfcl_eval itself.

    `functions` are BFCL docs (dicts) or hyfunc `Tool`s (converted with `Tool.to_bfcl`). As BFCL's
    generation does (`load_dataset_entry(include_language_specific_hint=True)`), the
    language-specific note (" Note that the provided function is in Python 3 syntax.") is appended
    to each description first unless `language_hint=False`.
    """
    mu = _bfcl_model_utils()
    docs = _as_docs(functions)
    if language_hint:
        docs = bfcl_utils()._func_doc_language_specific_pre_processing(docs, category)
    return mu.formulate_system_prompt(format_sensitivity_config=mu.DEFAULT_SYSTEM_PROMPT_FORMAT, functions=docs)


def bfcl_prompt_messages(
    messages: Sequence[dict], functions: Iterable[Any], category: str = "simple_python", language_hint: bool = True
) -> list[dict]:
    """The chat messages BFCL's prompting handlers send: the system prompt is inserted first, or
    prepended (followed by a blank line) to the question's own system message
    (`bfcl_eval.model_handler.utils.system_prompt_pre_processing_chat_model`)."""
    mu = _bfcl_model_utils()
    docs = _as_docs(functions)
    if language_hint:
        docs = bfcl_utils()._func_doc_language_specific_pre_processing(docs, category)
    msgs = [dict(m) for m in messages]
    # The test id only selects the prompt format; a plain id gives BFCL's default format.
    return mu.system_prompt_pre_processing_chat_model(msgs, docs, f"{category}_0")


