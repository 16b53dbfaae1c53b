"""`hyfunc bench agent`: the agent loop through real servers, scored task by task.

An agent framework sends the user's request with its tools, runs the calls the model makes, sends
their results back as `tool` messages and expects either the next calls or a text answer that uses
the results. This benchmark plays the framework with scripted tools (hyfunc/data/agent-tasks, hand
written): for each task, through the official `openai` SDK,

1. send the conversation and the tools (tool_choice unset: auto);
2. while the reply has tool calls: match each against the task's expected calls, answer each with
   a `tool` message (the canned result, or an error for a call the script does not know), and send
   again, at most MAX_REQUESTS requests in all;
3. score the text reply that ends the loop.

A task is correct when every expected call was made (any order, any number of requests), no call
was unscripted, the loop ended in a text reply, and that text holds every key fact and no transcript
markup (the server's own "Assistant called ..." lines or a raw <tool_call> block echoed back).
Each server given runs the same tasks in the same order; the report compares them.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hyfunc.data import AGENT_TASKS
from hyfunc.errors import InputError, require_extra
from hyfunc.eval.machine import cpu_info, git_state

MAX_REQUESTS = 6

#: What a text answer must not hold: the transcript lines the server writes for its models
#: (hyfunc/formats/messages.py), call markup of chat templates, and a call as JSON.
MARKUP = re.compile(
    r"</?tool_call|<\|[a-z_]+\|>|assistant called|result of [\w.]+:|done so far for this request|"
    r"\{\s*\"name\"\s*:|^\s*(user|assistant):", re.IGNORECASE | re.MULTILINE,
)


# --- the task set -----------------------------------------------------------------------------

@dataclass
class Expected:
    name: str
    arguments: dict[str, Any]  # a value may be {"one_of": [alternatives]}
    result: Any  # the canned result: prose, or JSON sent as its text

    def result_text(self) -> str:
        return self.result if isinstance(self.result, str) else json.dumps(self.result, ensure_ascii=False)


@dataclass
class Task:
    id: str
    kind: str  # single | parallel | dependent
    request: str
    tools: list[dict]  # OpenAI tools
    steps: list[list[Expected]]
    facts: list[list[str]]  # each fact: its acceptable spellings

    @property
    def expected(self) -> list[Expected]:
        return [call for step in self.steps for call in step]


def load_tasks(path: Path = AGENT_TASKS) -> list[Task]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    catalogue = data["tools"]
    return [
        Task(
            id=t["id"], kind=t["kind"], request=t["request"],
            tools=[{"type": "function", "function": {"name": name, **catalogue[name]}} for name in t["tools"]],
            steps=[[Expected(c["name"], c["arguments"], c["result"]) for c in step] for step in t["steps"]],
            facts=[[f] if isinstance(f, str) else list(f) for f in t["facts"]],
        )
        for t in data["tasks"]
    ]


# --- matching and scoring ---------------------------------------------------------------------

def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def value_matches(expected: Any, made: Any) -> bool:
    """Leniently: alternatives, strings by folded case and whitespace, numbers by value (a number
    written as a string counts), objects by the keys the expectation names."""
    if isinstance(expected, dict) and set(expected) == {"one_of"}:
        return any(value_matches(option, made) for option in expected["one_of"])
    if isinstance(expected, bool) or isinstance(made, bool):
        return isinstance(expected, bool) and isinstance(made, bool) and expected == made
    if isinstance(expected, (int, float)) or isinstance(made, (int, float)):
        a, b = _number(expected), _number(made)
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(expected, str):
        return isinstance(made, str) and _norm(expected) == _norm(made)
    if isinstance(expected, list):
        return isinstance(made, list) and len(made) == len(expected) and all(map(value_matches, expected, made))
    if isinstance(expected, dict):
        return isinstance(made, dict) and all(k in made and value_matches(v, made[k]) for k, v in expected.items())
    return expected == made


def call_matches(expected: Expected, name: str, arguments: Any) -> bool:
    """The name exactly, every expected argument leniently; arguments not expected are ignored."""
    return name == expected.name and isinstance(arguments, dict) and all(
        key in arguments and value_matches(value, arguments[key]) for key, value in expected.arguments.items()
    )


def script_for(task: Task, name: str, arguments: Any) -> Expected | None:
    """The expected call a made call matches (its canned result), None when unscripted."""
    return next((e for e in task.expected if call_matches(e, name, arguments)), None)


def score(task: Task, made: list[dict], text: str | None) -> list[str]:
    """Why the task failed (empty: correct). `made`: {"name", "arguments"} of every call made."""
    failures = [f"unscripted call {m['name']}({_short(m['arguments'])})" for m in made
                if script_for(task, m["name"], m["arguments"]) is None]
    unused = list(made)  # the expected calls as a multiset: each made call covers one
    for expected in task.expected:
        hit = next((m for m in unused if call_matches(expected, m["name"], m["arguments"])), None)
        if hit is None:
            failures.append(f"missing call {expected.name}({_short(expected.arguments)})")
        else:
            unused.remove(hit)
    if text is None:
        return failures + [f"no text answer after {MAX_REQUESTS} requests"]
    answer = _norm(text)
    failures += [f"missing fact {fact[0]!r}" for fact in task.facts if not any(_norm(f) in answer for f in fact)]
    if markup := MARKUP.search(text):
        failures.append(f"transcript markup in the answer: {markup.group(0).strip()!r}")
    return failures


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- the loop ---------------------------------------------------------------------------------

@dataclass
class TaskResult:
    task: str
    correct: bool = False
    reason: str | None = None  # the failures, joined
    requests: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds per request
    latency: float = 0.0  # their sum
    server_timings: list[dict] = field(default_factory=list)  # per request: the server's stages, seconds
    text: str | None = None  # the final text answer
    calls: list[dict] = field(default_factory=list)  # {"request", "name", "arguments", "scripted"}


def run_task(client: Any, model: str, task: Task, timeout: float) -> TaskResult:
    import openai

    result = TaskResult(task.id)
    messages: list[dict] = [{"role": "user", "content": task.request}]
    error = None
    while result.requests < MAX_REQUESTS:
        start = time.perf_counter()
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=messages, tools=task.tools, timeout=timeout)
            reply = raw.parse()
        except openai.APIError as err:
            error = f"request {result.requests + 1} failed: {type(err).__name__}: {_short(str(err), 200)}"
            break
        finally:
            result.latencies.append(round(time.perf_counter() - start, 4))
            result.requests += 1
        # Where the time went (hyfunc's Server-Timing header: the call decision, the text reply, ...).
        result.server_timings.append(server_timing(raw.headers.get("server-timing", "")))
        message = reply.choices[0].message
        if not message.tool_calls:
            result.text = message.content or ""
            break
        messages.append({"role": "assistant", "content": message.content, "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls
        ]})
        for call in message.tool_calls:
            try:
                arguments = json.loads(call.function.arguments or "{}")
            except json.JSONDecodeError:
                arguments = call.function.arguments  # kept as written: matches nothing
            script = script_for(task, call.function.name, arguments)
            result.calls.append({"request": result.requests, "name": call.function.name, "arguments": arguments,
                                 "scripted": script is not None})
            # An unscripted call still gets an answer, as a real tool's error would be: the loop goes on.
            content = script.result_text() if script else json.dumps(
                {"error": f"{call.function.name} cannot be called with these arguments here"})
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    result.latency = round(sum(result.latencies), 4)
    failures = ([error] if error else []) + score(task, result.calls, None if error else result.text)
    if error:  # the loop was cut short: "no text answer" would be a consequence, not a cause
        failures = [f for f in failures if not f.startswith("no text answer")]
    result.correct, result.reason = not failures, "; ".join(failures) or None
    return result


def server_timing(header: str) -> dict[str, float]:
    """{stage: seconds} of a Server-Timing header ("stage;dur=MILLISECONDS, ..."); {} without one."""
    stages = {}
    for part in header.split(","):
        name, _, rest = part.strip().partition(";")
        duration = re.search(r"dur=([0-9.]+)", rest)
        if name and duration:
            stages[name] = round(float(duration.group(1)) / 1000, 4)
    return stages


def connect(url: str, model: str, api_key: str | None, timeout: float) -> Any:
    """An SDK client for `url`, checked once: an unreachable server, a refused key or a model id
    the server does not serve is the user's to fix (one line), not 33 failed tasks."""
    openai = require_extra("openai", "test", "hyfunc bench agent")
    # No retries: a retried request's latency would count twice, and a failure should show.
    client = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key=api_key or "none", max_retries=0, timeout=timeout)
    try:
        served = [m.id for m in client.models.list(timeout=30)]
    except openai.APIConnectionError as err:
        # The SDK says only "Connection error."; its cause says why (refused, no such host, timeout).
        raise InputError(f"cannot reach a server at {url}: {err.__cause__ or err}") from None
    except openai.APIStatusError as err:
        raise InputError(f"the server at {url} answered GET /v1/models with {err.status_code}: {err.message}") from None
    if model not in served:
        raise InputError(f"the server at {url} serves {', '.join(served) or 'no model'}, not {model!r}: use --model")
    return client


# --- the report -------------------------------------------------------------------------------

def summary(results: list[dict], first: list[dict]) -> dict[str, Any]:
    """`first`: the first server's results, whose total over the same tasks is the ratio's reference."""
    total = sum(r["latency"] for r in results)
    first_total = sum(r["latency"] for r in first[: len(results)])
    stages: dict[str, float] = {}
    for stage, seconds in (item for r in results for timing in r["server_timings"] for item in timing.items()):
        stages[stage] = round(stages.get(stage, 0.0) + seconds, 3)
    return {
        "correct": sum(r["correct"] for r in results), "n": len(results),
        "median_latency_s": round(statistics.median(r["latency"] for r in results), 3) if results else None,
        "total_latency_s": round(total, 3),
        "median_requests": statistics.median(r["requests"] for r in results) if results else None,
        "total_vs_first": round(total / first_total, 3) if first_total else None,
        "server_stages_s": stages,  # the Server-Timing stages, added up over every request
    }


def command_line(args: argparse.Namespace) -> str:
    """The equivalent command, the API key masked (a report is shared; the key is not)."""
    parts = ["hyfunc", "bench", "agent", "--url", *args.url, "--model", args.model]
    parts += ["--api-key", "***"] if args.api_key else []
    parts += ["--tasks", str(args.tasks)] if args.tasks else []
    parts += ["--label", *args.label] if args.label else []
    return shlex.join(parts + ["--timeout", f"{args.timeout:g}", "--out", args.out])


def markdown(report: dict[str, Any]) -> str:
    machine, git = report["machine"], report["git"]
    commit = (git["commit"] or "no git")[:10] + (" (dirty tree)" if git["dirty"] else "")
    flags = ", ".join(machine["speed_flags"] or []) or "none of avx2/avx512"
    lines = [
        "# hyfunc bench agent", "",
        f"Command: `{report['command']}`", "",
        f"Commit {commit}; {machine['model']} × {machine['cores']} cores ({flags}).", "",
        f"{len(report['tasks'])} hand-written tasks (hyfunc/data/agent-tasks), each an agent loop: the request "
        f"with its tools, the scripted results sent back as `tool` messages, until a text answer (at most "
        f"{report['max_requests']} requests, not streamed). Correct: every expected call made, none unscripted, "
        "and a text answer holding every key fact and no transcript markup. Latency: a task's requests added up.",
        "", "| server | url | correct | median latency (s) | total latency (s) | median requests | total vs first |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for server in report["servers"]:
        s = server["summary"]
        lines.append(f"| {server['label']} | {server['url']} | {s['correct']}/{s['n']} | {s['median_latency_s']} | "
                     f"{s['total_latency_s']} | {s['median_requests']} | {s['total_vs_first']} |")
    lines += [""] + [f"Server stages of {server['label']} (s, all requests): " + (", ".join(
        f"{stage} {seconds}" for stage, seconds in server["summary"]["server_stages_s"].items()) or "not reported") + "."
        for server in report["servers"]]
    lines += ["", "## Per task", "", "| task | kind | " + " | ".join(s["label"] for s in report["servers"]) + " |",
              "|---|---|" + "---|" * len(report["servers"])]
    for i, task in enumerate(report["tasks"]):
        cells = []
        for server in report["servers"]:
            if i >= len(server["results"]):  # a run cut short
                cells.append("not run")
                continue
            r = server["results"][i]
            # one table row: a server's error message may span lines or hold a pipe
            verdict = "✓" if r["correct"] else "✗ " + " ".join((r["reason"] or "").split()).replace("|", "\\|")
            cells.append(f"{verdict} ({r['latency']:.2f} s, {r['requests']} req)")
        lines.append(f"| {task['id']} | {task['kind']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """Per-task latency, one bar per server side by side; a failed task's bar is hatched."""
    from hyfunc.eval.plots import pyplot

    plt = pyplot()
    servers, n = report["servers"], len(report["tasks"])
    width = 0.8 / max(len(servers), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * n * max(len(servers), 1) + 2), 4.5))
    for j, server in enumerate(servers):
        xs = [i + (j - (len(servers) - 1) / 2) * width for i in range(len(server["results"]))]
        bars = ax.bar(xs, [r["latency"] for r in server["results"]], width, label=server["label"], color=f"C{j}")
        for bar, r in zip(bars, server["results"]):
            if not r["correct"]:
                bar.set_hatch("//")
                bar.set_alpha(0.5)
    ax.set_xticks(range(n))
    ax.set_xticklabels([t["id"] for t in report["tasks"]], rotation=90, fontsize=7)
    ax.set_ylabel("seconds per task (all its requests)")
    ax.set_title("hyfunc bench agent: latency per task (hatched: not correct)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    tasks = load_tasks()
    if args.tasks is not None:
        if args.tasks < 1:
            raise InputError(f"--tasks {args.tasks}: give at least 1")
        tasks = tasks[: args.tasks]
    labels = args.label or list(args.url)
    if len(labels) != len(args.url):
        raise InputError(f"--label: {len(labels)} labels for {len(args.url)} servers; give one per --url")
    # Every server is checked before any runs: a typo in the second URL should not cost the first run.
    clients = [connect(url, args.model, args.api_key, args.timeout) for url in args.url]
    report: dict[str, Any] = {
        "command": command_line(args), "git": git_state(), "machine": cpu_info(),
        "max_requests": MAX_REQUESTS, "tasks": [{"id": t.id, "kind": t.kind} for t in tasks], "servers": [],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for url, label, client in zip(args.url, labels, clients):
        server: dict[str, Any] = {"label": label, "url": url, "summary": {}, "results": []}
        report["servers"].append(server)
        for task in tasks:
            r = run_task(client, args.model, task, args.timeout)
            print(f"{label} {task.id}: {'correct' if r.correct else 'wrong: ' + (r.reason or '')} "
                  f"({r.requests} requests, {r.latency:.2f} s)", flush=True)
            server["results"].append(asdict(r))
            server["summary"] = summary(server["results"], report["servers"][0]["results"])
            # Written after every task: a run cut short (a slow model, a time limit) keeps what it measured.
            (out / "agent.json").write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            (out / "agent.md").write_text(markdown(report), encoding="utf-8")
    plot(report, out / "agent.png")
    print((out / "agent.md").read_text(encoding="utf-8"))
    return 0
