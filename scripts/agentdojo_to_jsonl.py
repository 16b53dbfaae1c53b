"""Convert AgentDojo's user tasks (PyPI `agentdojo`, MIT) into fc-train's record format, as a second
out-of-distribution source for `hyfunc eval ood` (hyfunc/data/ood/README.md says what and why).

Each user task becomes one request: its prompt, every tool of its suite (the pydantic argument
models' JSON Schemas, made plain: `$ref`s inlined, `Optional[X]` as X, titles dropped) and the first
call of its ground truth (later calls depend on earlier calls' results, which a single step cannot
know). A task is kept only when its prompt states every value of that call (strings and list items
word for word, ignoring case; numbers as written), fc-train's rule for dialogues.

With `--steps`, it also writes agent conversations (hyfunc/data/ood/README.md): each task's ground-truth
calls made one per turn and run on the suite's environment, their real results (AgentDojo's own YAML
rendering) sent back, and the step that follows: after every call, a text answer; before the last, the
next call. Follow-ups: a finished task, a reply, then another task of the suite (its first call) or a
held-out small-talk line (no call).

    pip install --no-deps --target /tmp/agentdojo agentdojo==0.1.35 && \
      pip install --target /tmp/agentdojo deepdiff docstring-parser email-validator
    PYTHONPATH=/tmp/agentdojo python scripts/agentdojo_to_jsonl.py --out hyfunc/data/ood/agentdojo.jsonl \
      --steps hyfunc/data/ood/agentdojo-steps.json
"""
from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter
from pathlib import Path

from hyfunc.eval.refusal import held_out_off_topic

SUITES = ("banking", "slack", "travel", "workspace")
_DROPPED_KEYS = {"title", "$defs"}
# A conversation's tool results are kept to this many characters in all: a 7,000-token file would
# fill the context of a 2-core CPU run (longer ones are dropped and counted, never cut).
MAX_RESULTS_CHARS = 4000
# Ground truth that leaves a value to the model ("<summary>"): no exact call to score it by.
_PLACEHOLDER = re.compile(r"^<[^<>]+>$")


def plain_schema(schema: dict, defs: dict) -> dict:
    if "$ref" in schema:
        return plain_schema(defs[schema["$ref"].split("/")[-1]], defs)
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        merged = {**plain_schema(options[0], defs), **{k: v for k, v in schema.items() if k not in ("anyOf", "default")}}
        if schema.get("default") is not None:
            merged["default"] = schema["default"]
        return plain_schema(merged, defs)
    out = {k: v for k, v in schema.items() if k not in _DROPPED_KEYS and not (k == "default" and v is None)}
    if "properties" in out:
        out["properties"] = {k: plain_schema(v, defs) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = plain_schema(out["items"], defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def tool_record(function) -> dict:
    schema = function.parameters.model_json_schema()
    parameters = plain_schema(schema, schema.get("$defs", {}))
    parameters.setdefault("properties", {})
    parameters["required"] = list(schema.get("required", []))
    return {"name": function.name, "description": function.description.strip(), "parameters": parameters}


def stated(value, prompt: str) -> bool:
    """Whether the prompt gives `value` (fc-train's rule: a value the request does not hold drops it)."""
    text = prompt.lower()
    if isinstance(value, bool) or value is None:
        return True  # a flag is asked for in words, not written
    if isinstance(value, (int, float)):
        return any(form in text for form in {str(value), f"{value:g}", f"{value:,}"})
    if isinstance(value, str):
        return value.lower() in text
    if isinstance(value, list):
        return all(stated(v, prompt) for v in value)
    if isinstance(value, dict):
        return all(stated(v, prompt) for v in value.values())
    return False


def arguments_of(call) -> dict:
    return {k: v for k, v in dict(call.args).items() if v is not None}


def has_placeholder(arguments: dict) -> bool:
    return any(isinstance(v, str) and _PLACEHOLDER.match(v) for v in arguments.values())


def executed(suite, environment, calls) -> list[tuple[dict, str]]:
    """Each call as a wire-format dict and its real result: run in order on a copy of the
    environment, rendered as AgentDojo's agents send them back (YAML, or the error)."""
    from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
    from agentdojo.functions_runtime import FunctionsRuntime

    runtime, state = FunctionsRuntime(suite.tools), environment.model_copy(deep=True)
    out = []
    for call in calls:
        result, error = runtime.run_function(state, call.function, dict(call.args))
        text = tool_result_to_str(result) if error is None else error
        out.append(({"name": call.function, "arguments": arguments_of(call)}, text))
    return out


def turns(task_key: str, made: list[tuple[dict, str]]) -> list[dict]:
    """One call per assistant turn, each followed by its result (AgentDojo's agents call one at a time)."""
    messages = []
    for i, (call, result) in enumerate(made):
        call_id = f"call_{task_key}_{i}"
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
    return messages


def task_steps(suite_name: str, task_id: str, prompt: str, made: list[tuple[dict, str]], dropped: Counter) -> list[dict]:
    """After k of the task's n calls: the next call (k < n) or a text answer (k = n)."""
    steps = []
    user = {"role": "user", "content": prompt}
    for k in range(1, len(made) + 1):
        if sum(len(result) for _, result in made[:k]) > MAX_RESULTS_CHARS:
            dropped["step: results over the length cap"] += 1
            break
        if any(has_placeholder(call["arguments"]) for call, _ in made[:k + 1]):
            dropped["step: a value left to the model"] += 1
            break
        done = k == len(made)
        steps.append({"id": f"agentdojo-{suite_name}-{task_id}:after{k}", "suite": suite_name,
                      "kind": "answer" if done else "calls_left", "label": "answer" if done else "call",
                      "messages": [user, *turns(task_id, made[:k])], "remaining": [call for call, _ in made[k:]]})
    return steps


def follow_up_steps(suite_name: str, finished: list[tuple[str, str, list]], firsts: list[dict], rng: random.Random) -> list[dict]:
    """A finished task (its calls, results and a reply quoting the last result), then the user's next
    message: another task of the suite whose first call its prompt states ("call"), or small talk ("answer")."""
    small_talk = held_out_off_topic()
    steps = []
    for i, (task_id, prompt, made) in enumerate(finished):
        others = [r for r in firsts if not r["id"].endswith(f"-{task_id}")]
        if not others:
            continue
        reply = " ".join(made[-1][1].split())[:200]
        history = [{"role": "user", "content": prompt}, *turns(task_id, made),
                   {"role": "assistant", "content": f"Here is what I found: {reply}"}]
        second = others[i % len(others)]
        for kind, message, label, remaining in (
            ("follow_up", second["query"], "call", second["answers"]),
            ("follow_up_small_talk", rng.choice(small_talk), "answer", []),
        ):
            steps.append({"id": f"agentdojo-{suite_name}-{task_id}:{kind}", "suite": suite_name, "kind": kind,
                          "label": label, "messages": [*history, {"role": "user", "content": message}],
                          "remaining": remaining})
    return steps


def main() -> None:
    from agentdojo.task_suite.load_suites import get_suite

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="v1", help="AgentDojo benchmark version")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", help="also write the agent conversations here (JSON)")
    args = parser.parse_args()
    records, dropped = [], Counter()
    suites, steps, rng = {}, [], random.Random(0)
    for name in SUITES:
        suite = get_suite(args.version, name)
        tools = [tool_record(f) for f in suite.tools]
        suites[name] = tools
        environment = suite.load_and_inject_default_environment({})
        finished, suite_records = [], len(records)
        for task_id, task in suite.user_tasks.items():
            calls = task.ground_truth(environment.model_copy(deep=True))
            prompt = " ".join(task.PROMPT.split())
            if args.steps:
                made = executed(suite, environment, calls)
                task_made = task_steps(name, task_id, prompt, made, dropped)
                steps += task_made
                if task_made and task_made[-1]["label"] == "answer":
                    finished.append((task_id, prompt, made))
            if not calls:
                dropped["no ground-truth call"] += 1
                continue
            first = calls[0]
            arguments = arguments_of(first)
            if not all(stated(v, prompt) for v in arguments.values()):
                dropped["a value the prompt does not state"] += 1
                continue
            records.append({"id": f"agentdojo-{name}-{task_id}", "source": "agentdojo", "query": prompt,
                            "tools": tools, "answers": [{"name": first.function, "arguments": arguments}]})
        if args.steps:
            steps += follow_up_steps(name, finished, records[suite_records:], rng)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    if args.steps:
        data = json.dumps({"suites": suites, "steps": steps}, ensure_ascii=False, separators=(",", ":"))
        Path(args.steps).write_text(data, encoding="utf-8")
        print(f"{len(steps)} steps: {dict(Counter(s['kind'] for s in steps))}")
    print(f"{len(records)} tasks kept; dropped: {dict(dropped)}")


if __name__ == "__main__":
    main()
