"""BFCL's multi-turn categories: conversations over BFCL's simulated APIs (a file system, a
trading bot, a messaging app, ...), run the way bfcl-eval's own inference loop runs them and scored
by its multi-turn checker.

The loop follows `bfcl_eval.model_handler.base_handler.inference_multi_turn_FC`: each user turn is
answered step by step; a step's calls are executed on the simulated APIs by bfcl-eval
(`execute_multi_turn_func_call`) and their results go back to the method as `tool` messages; the
turn ends at a step without a call (a text answer, or output that is not a valid call), and the
whole conversation is lost after `MAXIMUM_STEP_LIMIT` steps in one turn. In `multi_turn_miss_func`
the held-out functions join the tools at their turn, with BFCL's user message for that. The
conversation reaches the method as chat messages (assistant `tool_calls`, `tool` results), as a
client of `hyfunc serve` would send it. The calls of every step are then scored by
`multi_turn_checker`, which replays them and compares the APIs' states and results with the ground
truth's after every turn.
"""
from __future__ import annotations

import copy
import re
import statistics
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hyfunc.eval.records import jsonable
from hyfunc.formats.bfcl import BfclError, bfcl_utils, import_bfcl, is_multi_turn_category
from hyfunc.formats.calls import Call, to_bfcl_output, to_openai_tool_calls
from hyfunc.formats.schema import Tool, parse_tools


@dataclass
class MultiTurnCase:
    id: str
    category: str
    turns: list[list[dict]]  # the user messages of each turn ([] where functions are added)
    functions: list[dict]  # BFCL function docs offered from the first turn
    added_functions: dict[int, list[dict]]  # turn -> docs that join the tools there (miss_func)
    initial_config: dict
    involved_classes: list[str]
    ground_truth: list[list[str]]  # per turn, the calls as BFCL writes them: "cd(folder='x')"


def load_multi_turn_cases(category: str, limit: int | None = None) -> list[MultiTurnCase]:
    """One multi-turn category from bfcl-eval's packaged data, read by bfcl-eval's own loader
    (function docs of the involved APIs, held-out functions taken out, Python note added)."""
    if not is_multi_turn_category(category):
        raise BfclError(f"{category!r} is not a multi-turn category")
    utils = bfcl_utils()
    entries = utils.load_dataset_entry(category)
    if limit is not None:
        entries = entries[: max(0, limit)]
    truth = {e["id"]: e["ground_truth"] for e in utils.load_ground_truth_entry(category)}
    cases = []
    for e in entries:
        if e["id"] not in truth:
            raise BfclError(f"bfcl-eval's data has no ground truth for {e['id']}")
        cases.append(MultiTurnCase(
            id=e["id"], category=category, turns=e["question"], functions=e["function"],
            added_functions={int(turn): docs for turn, docs in e.get("missed_function", {}).items()},
            initial_config=e.get("initial_config", {}), involved_classes=e["involved_classes"],
            ground_truth=truth[e["id"]],
        ))
    return cases


def _long_context(case: MultiTurnCase) -> bool:
    # bfcl-eval loads the large scenarios (long file listings, ...) for these.
    return "long_context" in case.category or "composite" in case.category


def call_strings(calls: list[Call], tools: list[Tool]) -> list[str]:
    """The calls as bfcl-eval's executor reads them (its `convert_to_function_call`).

    bfcl-eval runs these strings with `eval`. Each is built, not copied from model text: a name
    among the offered tools and keyword arguments holding `repr`s of JSON values, so nothing but
    a call of a simulated API can run."""
    names = {tool.name for tool in tools}
    for call in calls:
        if call.name not in names or not all(key.isidentifier() for key in call.arguments):
            raise BfclError(f"refusing to execute {call.name}({', '.join(call.arguments)}): not an offered tool's call")
    return import_bfcl("bfcl_eval.model_handler.utils").convert_to_function_call(to_bfcl_output(calls))


class SimulatedApis:
    """One conversation's instances of BFCL's simulated APIs. bfcl-eval keeps them in its executor
    module's globals under a name built from a model name and the case id; `key` is unique per
    conversation, so the methods of a side-by-side run (and repeated runs) never share state, and
    `close` drops them (the checker's replays too)."""

    def __init__(self, case: MultiTurnCase):
        self.case = case
        self.key = f"hyfunc_{uuid.uuid4().hex[:16]}"
        self._executor = import_bfcl("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")

    def execute(self, calls: list[str]) -> list[str]:
        results, _ = self._executor.execute_multi_turn_func_call(
            calls, self.case.initial_config, self.case.involved_classes, self.key, self.case.id,
            long_context=_long_context(self.case), is_evaL_run=False,
        )
        return [str(r) for r in results]

    def close(self) -> None:
        for name in [n for n in vars(self._executor) if n.startswith(self.key)]:
            delattr(self._executor, name)


def fix_library(method, tools: list[Tool]) -> float:
    """Fix the conversation's tools as a library where the method can (the cascade: the KV cache of
    its prompt prefix with the tools, built once and reused by every step, as `hyfunc serve` does
    for a client's tools); returns the seconds it took, which count in the conversation's latency
    as direct prompting's first prefill of the tools does (it reuses them with `--prefix-caching`)."""
    use = getattr(method, "use_library", None)
    state = method.library_state() if hasattr(method, "library_state") else None
    if use is None or (state is not None and state.tools == tools):
        return 0.0
    start = time.perf_counter()
    use(tools)
    return time.perf_counter() - start


def run_conversation(method, case: MultiTurnCase, apis: SimulatedApis) -> dict:
    """Answer every turn of `case`; returns the turns' steps and the totals for the record."""
    constants = import_bfcl("bfcl_eval.constants.default_prompts")
    docs = copy.deepcopy(case.functions)
    tools = parse_tools(docs)
    messages: list[dict] = []
    turns: list[list[dict]] = []
    totals: dict[str, Any] = {"latency": 0.0, "input_tokens": 0, "output_tokens": 0, "cached_tokens": 0,
                              "injected_tokens": 0, "timings": {}, "steps": 0, "model_errors": 0}
    force_quit = False
    for index, user_messages in enumerate(case.turns):
        if index in case.added_functions:
            docs += copy.deepcopy(case.added_functions[index])
            tools = parse_tools(docs)
            user_messages = [{"role": "user", "content": constants.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC}]
        messages += copy.deepcopy(user_messages)
        seconds = fix_library(method, tools)
        totals["latency"] += seconds
        totals["timings"]["library"] = totals["timings"].get("library", 0.0) + seconds
        steps: list[dict] = []
        while True:
            start = time.perf_counter()
            answer = method.answer(copy.deepcopy(messages), tools)
            totals["latency"] += time.perf_counter() - start + answer.reused_seconds
            for key in ("input_tokens", "output_tokens", "cached_tokens", "injected_tokens"):
                totals[key] += int(getattr(answer, key) or 0)
            for stage, spent in answer.timings.items():
                totals["timings"][stage] = totals["timings"].get(stage, 0.0) + spent
            totals["steps"] += 1
            totals["model_errors"] += answer.error is not None
            step: dict[str, Any] = {"calls": [], "text": answer.raw_text, "error": answer.error,
                                    "details": jsonable(answer.details)}
            steps.append(step)
            if answer.error is not None or not answer.calls:  # BFCL: no decodable call ends the turn
                messages.append({"role": "assistant", "content": answer.raw_text})
                break
            step["calls"] = call_strings(answer.calls, tools)
            step["results"] = apis.execute(step["calls"])
            tool_calls = to_openai_tool_calls(answer.calls)
            messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
            messages += [{"role": "tool", "tool_call_id": call["id"], "content": result}
                         for call, result in zip(tool_calls, step["results"])]
            if len(steps) > constants.MAXIMUM_STEP_LIMIT:
                force_quit = True
                break
        turns.append(steps)
        if force_quit:
            break
    return {"turns": turns, "force_quit": force_quit, **totals}


def check_conversation(case: MultiTurnCase, turns: list[list[dict]], apis: SimulatedApis) -> tuple[bool, str]:
    """bfcl-eval's verdict on the calls of every step (as `eval_runner._evaluate_single_multi_turn_entry`
    reads them: steps without calls left out, a conversation cut short is wrong)."""
    if len(turns) != len(case.ground_truth):
        return False, (f"[multi_turn:force_terminated] {len(turns)} of {len(case.ground_truth)} turns answered: "
                       "a turn ran past bfcl-eval's step limit")
    decoded = [[step["calls"] for step in turn if step["calls"]] for turn in turns]
    checker = import_bfcl("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker").multi_turn_checker
    entry = {"id": case.id, "initial_config": case.initial_config, "involved_classes": case.involved_classes}
    try:
        result = checker(decoded, case.ground_truth, entry, case.category, apis.key)
    except Exception as e:  # the official runner would crash; the case is scored wrong instead
        return False, f"checker raised {type(e).__name__}: {e}"
    if result["valid"]:
        return True, ""
    return False, f"[{result.get('error_type', '')}] {result.get('error_message', '')}".strip()


def evaluate_multi_turn_case(method, case: MultiTurnCase) -> dict:
    """Run `method` through one conversation and score it; the record written to cases.jsonl."""
    apis = SimulatedApis(case)
    try:
        run = run_conversation(method, case, apis)
        correct, error = check_conversation(case, run["turns"], apis)
    finally:
        apis.close()
    return {"id": case.id, "category": case.category, "correct": correct, "error": error,
            "model_error": None, "gold_functions": [], **run}


def conversation_figures(records: list[dict]) -> dict[str, dict] | None:
    """Per multi-turn category: how the conversations failed (bfcl-eval's error types), the steps
    per conversation and the turns cut by the step limit; None when no record is multi-turn."""
    out = {}
    for category in dict.fromkeys(r["category"] for r in records if "turns" in r):
        rows = [r for r in records if r["category"] == category and "turns" in r]
        failures = Counter(_error_type(r["error"]) for r in rows if not r["correct"])
        out[category] = {
            "n": len(rows),
            "failures": dict(failures.most_common()),
            "steps_median": statistics.median(r["steps"] for r in rows),
            "calls_executed": sum(len(s["calls"]) for r in rows for t in r["turns"] for s in t),
            "invalid_outputs": sum(bool(s["error"]) for r in rows for t in r["turns"] for s in t),
            "step_limit_hit": sum(bool(r["force_quit"]) for r in rows),
        }
    return out or None


def _error_type(error: str) -> str:
    match = re.match(r"\[([^\]]*)\]", error)
    return match.group(1) if match else error.split(":")[0]


def conversation_markdown(figures: dict[str, dict]) -> list[str]:
    lines = ["| category | n | median steps | calls executed | outputs not a valid call | step limit hit | failures |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for category, f in figures.items():
        failures = ", ".join(f"{kind} {count}" for kind, count in f["failures"].items()) or "–"
        lines.append(f"| {category} | {f['n']} | {f['steps_median']:g} | {f['calls_executed']} | {f['invalid_outputs']} | "
                     f"{f['step_limit_hit']} | {failures} |")
    return lines
