"""BFCL evaluation with the official checker of the `bfcl-eval` package (BFCL v4).

Nothing here re-implements BFCL's scoring: AST categories go through
`bfcl_eval.eval_checker.ast_eval.ast_checker.ast_checker`, the relevance rule through
`bfcl_eval.utils.is_empty_output`, exactly as `bfcl_eval/eval_checker/eval_runner.py` does, and the
function docs given to the checker are the original ones from the data file. The multi-turn
categories run conversations over BFCL's simulated APIs and go through its multi-turn checker
(`hyfunc.eval.bfcl_multi_turn`).

The package is imported through `hyfunc.formats.bfcl` (lean install, project root).
"""
from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from tqdm import tqdm

from hyfunc.eval import report
from hyfunc.eval.bfcl_multi_turn import MultiTurnCase, evaluate_multi_turn_case, load_multi_turn_cases
from hyfunc.eval.provenance import provenance
from hyfunc.eval.records import done_ids, jsonable, read_case_records
from hyfunc.formats.bfcl import (
    ALIASES,
    CATEGORIES,
    EXTRA_CATEGORIES,
    INSTALL_HINT,
    BfclError,
    bfcl_eval_version,
    bfcl_utils,
    canonical_category,
    import_bfcl,
    is_multi_turn_category,
    official_ast_checker,
)
from hyfunc.formats.calls import to_bfcl_output
from hyfunc.formats.schema import parse_tools

#: `ast_checker` needs a registry name from bfcl_eval's MODEL_CONFIG_MAPPING; it only uses it to
#: decide whether dots in function names were turned into underscores (OpenAI-style FC models).
#: hyfunc keeps BFCL's dotted names, so we use a prompting model whose entry has
#: ``underscore_to_dot=False``. The runner passes names with "/" written as "_".
CHECKER_MODEL_NAME = "Qwen_Qwen3-8B"

# ---------------------------------------------------------------------------------------------
# Data


@dataclass
class BfclCase:
    id: str
    category: str
    messages: list[dict]  # the single-turn question: [{"role", "content"}, ...], system kept
    functions: list[dict]  # raw BFCL function docs, as in the data file
    possible_answer: list[dict] | None  # BFCL ground truth; None for (ir)relevance categories


def is_relevance_category(category: str) -> bool:
    return "relevance" in category  # covers irrelevance, live_irrelevance, live_relevance


def packaged_data_dir() -> Path:
    """The data folder shipped inside the installed bfcl_eval package (found without importing it)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise BfclError(INSTALL_HINT)
    return Path(list(spec.submodule_search_locations)[0]) / "data"


# Tokens of category names: a file "X_<category>.json" belongs to <category> only if X does not
# itself end with such a token ("BFCL_v4_live_simple.json" is not a "simple" file).
_CATEGORY_TOKENS = {t for c in CATEGORIES + EXTRA_CATEGORIES + list(ALIASES) for t in c.split("_")}


def _find_file(folder: Path, category: str) -> Path | None:
    names = [category] + [old for old, new in ALIASES.items() if new == category]
    for name in names:
        for prefix in ("BFCL_v4_", "BFCL_v3_"):
            p = folder / f"{prefix}{name}.json"
            if p.is_file():
                return p
    for name in names:
        hits = []
        for p in sorted(folder.glob(f"*_{name}.json")):
            prefix = p.name[: -len(f"_{name}.json")]
            if prefix.split("_")[-1] not in _CATEGORY_TOKENS:
                hits.append(p)
        if len(hits) > 1:
            raise BfclError(f"several files for category {category!r} in {folder}: {[h.name for h in hits]}")
        if hits:
            return hits[0]
        p = folder / f"{name}.json"
        if p.is_file():
            return p
    return None


def _read_jsonl(path: Path) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise BfclError(f"{path}:{lineno}: not a JSON line ({e})") from None
    return out


def data_files(category: str, data_dir: str | Path | None = None) -> tuple[Path, Path | None]:
    """(question file, possible-answer file or None for relevance categories)."""
    category = canonical_category(category)
    folder = Path(data_dir) if data_dir is not None else packaged_data_dir()
    q = _find_file(folder, category)
    if q is None:
        raise BfclError(f"no question file for category {category!r} in {folder}")
    if is_relevance_category(category):
        return q, None
    a = _find_file(folder / "possible_answer", category)
    if a is None:
        raise BfclError(f"no possible-answer file for category {category!r} in {folder / 'possible_answer'}")
    return q, a


def load_cases(
    category: str, data_dir: str | Path | None = None, limit: int | None = None
) -> list[BfclCase] | list[MultiTurnCase]:
    """Read one BFCL category (packaged bfcl_eval data by default), in file order."""
    category = canonical_category(category)
    if is_multi_turn_category(category):
        if data_dir is not None:
            raise BfclError(f"{category} is read from bfcl-eval's packaged data (its simulated APIs and their "
                            "states go with it); --data-dir holds single-turn categories only")
        return load_multi_turn_cases(category, limit)
    q_path, a_path = data_files(category, data_dir)
    entries = _read_jsonl(q_path)
    if limit is not None:
        entries = entries[: max(0, limit)]
    answers: dict[str, Any] = {}
    if a_path is not None:
        answers = {e["id"]: e["ground_truth"] for e in _read_jsonl(a_path)}
    cases = []
    for e in entries:
        cid = e.get("id")
        question = e.get("question")
        if not isinstance(cid, str) or not isinstance(question, list) or not question:
            raise BfclError(f"{q_path}: malformed entry {str(e)[:200]}")
        if len(question) != 1:
            raise BfclError(f"{q_path}: case {cid} is multi-turn ({len(question)} turns); only single-turn is supported")
        messages = [{"role": m["role"], "content": m["content"]} for m in question[0]]
        possible = None
        if a_path is not None:
            if cid not in answers:
                raise BfclError(f"{a_path}: no possible answer for case {cid}")
            possible = answers[cid]
        cases.append(BfclCase(cid, category, messages, e.get("function", []), possible))
    return cases


# ---------------------------------------------------------------------------------------------
# Checking


def check(case: BfclCase, model_output: list[dict] | None, decode_error: str | None = None) -> tuple[bool, str]:
    """Score one case with BFCL's own logic; returns (correct, error text).

    `model_output` is the decoded output ``[{func_name: {arg: value}}]``; pass ``None`` (or a
    `decode_error`) when the model's text could not be decoded into calls. For (ir)relevance
    categories BFCL counts a failed decode or an empty output as "no function call"
    (`eval_runner._evaluate_single_relevance_entry`); for AST categories a failed decode is wrong.
    """
    utils = bfcl_utils()
    decoded_ok = model_output is not None and decode_error is None
    if is_relevance_category(case.category):
        contain_func_call = decoded_ok and not utils.is_empty_output(model_output)
        if "irrelevance" in case.category:
            if contain_func_call:
                return False, "Valid syntax. Successfully decode AST when it should not."
            return True, ""
        if not contain_func_call:
            return False, f"Invalid syntax. Failed to decode AST when it should have. {decode_error or ''}".strip()
        return True, ""

    if not decoded_ok:
        return False, f"Invalid syntax. Failed to decode AST. {decode_error or ''}".strip()
    if not utils.is_function_calling_format_output(model_output):
        return False, "Did not output in the specified format."
    ast_checker = official_ast_checker()
    language = import_bfcl("bfcl_eval.constants.enums").Language.PYTHON
    try:
        result = ast_checker(
            copy.deepcopy(case.functions),
            copy.deepcopy(model_output),
            copy.deepcopy(case.possible_answer),
            language,
            case.category,
            CHECKER_MODEL_NAME,
        )
    except Exception as e:  # the official runner would crash; we score the case wrong instead
        return False, f"checker raised {type(e).__name__}: {e}"
    if result["valid"]:
        return True, ""
    errors = result.get("error") or []
    text = "; ".join(str(x) for x in errors) if isinstance(errors, list) else str(errors)
    return False, f"[{result.get('error_type', '')}] {text}".strip()


# ---------------------------------------------------------------------------------------------
# Running a method over BFCL


def gold_functions(case: BfclCase) -> list[str]:
    """Names of the functions the ground truth calls (with repeats for parallel calls); [] for
    the (ir)relevance categories."""
    return [name for call in case.possible_answer or [] for name in call]


def evaluate_case(method, case: BfclCase) -> dict:
    """Run `method` on one case and score it; returns the record written to cases.jsonl."""

    record: dict[str, Any] = {"id": case.id, "category": case.category, "gold_functions": gold_functions(case)}
    try:
        tools = parse_tools(case.functions)
    except Exception as e:  # hyfunc's own failure: never counted as a success
        record.update(correct=False, error=f"hyfunc could not read the tools: {type(e).__name__}: {e}",
                      calls=None, raw_text="", timings={}, latency=0.0, input_tokens=0, output_tokens=0)
        return record
    t0 = time.perf_counter()
    answer = method.answer(copy.deepcopy(case.messages), tools)
    wall = time.perf_counter() - t0
    if answer.error is not None:
        model_output, decode_error = None, answer.error
    else:
        model_output, decode_error = to_bfcl_output(answer.calls), None
    correct, error = check(case, model_output, decode_error)
    record.update(
        correct=correct,
        error=error,
        calls=jsonable(model_output),
        model_error=answer.error,
        raw_text=answer.raw_text,
        timings=dict(answer.timings),
        latency=wall + answer.reused_seconds,
        input_tokens=int(answer.input_tokens or 0),
        output_tokens=int(answer.output_tokens or 0),
        cached_tokens=int(answer.cached_tokens or 0),
        injected_tokens=int(answer.injected_tokens or 0),
        reused_seconds=answer.reused_seconds,
        details=jsonable(answer.details),
    )
    return record


def run_eval(
    method,
    categories: Sequence[str] | None = None,
    limit: int | None = None,
    out_dir: str | Path = "reports/bfcl",
    data_dir: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
    write_report: bool = True,
) -> dict:
    """Score `method` (anything with ``answer(messages, tools) -> Answer``) on BFCL.

    One JSON line per case is appended to ``out_dir/cases.jsonl`` and flushed at once; with
    `resume`, cases whose id is already there are skipped, so an interrupted run continues where it
    stopped. `limit` caps the number of cases per category. Returns the summary also written to
    ``results.json`` (plus results.md and accuracy_latency.png).
    """
    name = getattr(method, "name", "method")
    return run_side_by_side({name: method}, categories, limit, {name: Path(out_dir)}, data_dir, resume, progress, write_report)[name]


def run_side_by_side(
    methods: Mapping[str, Any],
    categories: Sequence[str] | None = None,
    limit: int | None = None,
    out_dirs: Mapping[str, str | Path] | None = None,
    data_dir: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
    write_report: bool = True,
) -> dict[str, dict]:
    """Score several methods on the same cases, interleaved: each case is answered by every method
    in turn before the next case, so machine noise falls on all of them alike and latency ratios
    are measured side by side. Each method keeps its own resumable ``cases.jsonl`` in its out dir
    (default ``reports/bfcl/<label>``). Returns label -> summary.
    """
    categories = [canonical_category(c) for c in (categories or CATEGORIES)]
    dirs = {label: Path(out_dirs[label]) if out_dirs and label in out_dirs else Path("reports/bfcl") / label for label in methods}
    done: dict[str, set[str]] = {}
    for label, out in dirs.items():
        out.mkdir(parents=True, exist_ok=True)
        if not resume and (out / "cases.jsonl").exists():
            (out / "cases.jsonl").unlink()
        done[label] = done_ids(out / "cases.jsonl")

    all_cases = [c for cat in categories for c in load_cases(cat, data_dir, limit)]
    wanted = {c.id for c in all_cases}
    todo = [c for c in all_cases if any(c.id not in done[label] for label in methods)]
    # Conversations over the same APIs one after another: their prompts share the tools (exact prefix reuse).
    todo.sort(key=lambda c: (categories.index(c.category), tuple(getattr(c, "involved_classes", ()))))
    files = {label: open(dirs[label] / "cases.jsonl", "a", encoding="utf-8") for label in methods}
    try:
        with tqdm(total=len(all_cases), initial=len(all_cases) - len(todo), unit="case", disable=not progress,
                  desc=f"BFCL {', '.join(methods)}") as bar:
            for case in todo:
                for label, method in methods.items():
                    if case.id in done[label]:
                        continue
                    if isinstance(case, MultiTurnCase):
                        record = evaluate_multi_turn_case(method, case)
                    else:
                        record = evaluate_case(method, case)
                    files[label].write(json.dumps(record, ensure_ascii=False, default=repr) + "\n")
                    files[label].flush()
                    os.fsync(files[label].fileno())
                bar.set_postfix(cat=case.category)
                bar.update(1)
    finally:
        for f in files.values():
            f.close()

    summaries = {}
    for label, method in methods.items():
        records = [r for r in read_case_records(dirs[label]) if r["id"] in wanted]
        summary = report.summarize(records, categories)
        summary["meta"] = run_metadata(method, categories, limit, data_dir)
        if write_report:
            report.write_reports(summary, dirs[label])
        summaries[label] = summary
    return summaries


def _method_config(method) -> Any:
    cfg = getattr(method, "config", None)
    if cfg is None:
        return None
    try:
        from dataclasses import asdict, is_dataclass

        if is_dataclass(cfg):
            return jsonable(asdict(cfg))
        if isinstance(cfg, dict):
            return jsonable(cfg)
        if hasattr(cfg, "__dict__"):
            return jsonable(vars(cfg))
    except Exception:
        pass
    return repr(cfg)


def hyfunc_version() -> str:
    try:
        from importlib.metadata import version

        return version("hyfunc")
    except Exception:
        mod = sys.modules.get("hyfunc")
        return getattr(mod, "__version__", "unknown")


def run_metadata(method, categories, limit, data_dir) -> dict:
    import datetime

    return {
        "command": list(sys.argv),
        "method": getattr(method, "name", type(method).__name__),
        "method_config": _method_config(method),
        "categories": list(categories),
        "limit": limit,
        "data_dir": str(data_dir) if data_dir is not None else f"bfcl_eval package ({packaged_data_dir()})",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hyfunc_version": hyfunc_version(),
        "bfcl_eval_version": bfcl_eval_version(),
        "checker": "bfcl_eval.eval_checker.ast_eval.ast_checker.ast_checker; multi-turn: "
        "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker.multi_turn_checker",
        "checker_model_name": CHECKER_MODEL_NAME,
        "python": sys.version.split()[0],
        "provenance": provenance([method]),
    }


__all__ = [
    "CATEGORIES",
    "BfclCase",
    "BfclError",
    "load_cases",
    "data_files",
    "packaged_data_dir",
    "check",
    "evaluate_case",
    "run_eval",
    "read_case_records",
]
