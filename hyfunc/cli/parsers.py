"""Every option of the `hyfunc` command line.

Building the parser imports no model code (torch, transformers, the server): each command names its
handler as "module:function", imported by `hyfunc.cli.main` only when that command runs, so that
`hyfunc --help` and a typo answer at once. The constants read here live in light modules.
"""
from __future__ import annotations

import argparse
import os

import hyfunc
from hyfunc.cascade.agent_steps import STEP_KINDS
from hyfunc.cli.checks import CALL_FORMATS
from hyfunc.data import FC_TRAIN, OOD_DATA
from hyfunc.eval.ood import HELD_OUT_SOURCES
from hyfunc.formats.bfcl import ALIASES, CATEGORIES, EXTRA_CATEGORIES
from hyfunc.methods import ABLATABLE, METHODS, PROMPT_STYLES
from hyfunc.models.engines import DEFAULT_ENGINE, ENGINES
from hyfunc.models.registry import DEFAULT_LARGE, DEFAULT_SMALL
from hyfunc.routing.store import FEEDBACK

COMMANDS = "hyfunc.cli.commands"
BENCHMARKS = "hyfunc.cli.benchmarks"
ODIA = "hyfunc.cli.odia"

#: Optional dependencies a command needs, (module, the extra that installs it): `main` checks them
#: before the handler loads anything, so a missing extra is one line, not a traceback minutes in.
SERVER = (("fastapi", "serve"), ("uvicorn", "serve"), ("prometheus_client", "serve"))
PLOTS = (("matplotlib", "eval"),)
TRAINING = (("yaml", "train"), ("chatterbot_corpus", "train"))

TRAFFIC_HELP = ("log every answer for learning from traffic: bare flag = the embedded SQLite file in "
                "$HYFUNC_HOME, or a SQLite path / postgresql://user@host/db (a log shared by several servers)")
STORE_HELP = ("traffic store: a SQLite file path or sqlite:///path, or postgresql://user@host/db "
              "(default: traffic.sqlite in $HYFUNC_HOME)")


def ablation_spec(spec: str) -> str:
    """An `--ablations` item: a stage, or stages joined by '+' (one variant with all of them off)."""
    unknown = [stage for stage in spec.split("+") if stage not in ABLATABLE]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown stage {unknown[0]!r}; stages: {', '.join(ABLATABLE)}")
    return spec


def _batch_size(text: str) -> int:
    """--batch: 1 to 4 (each request running beside others holds KV sequences of both models)."""
    value = int(text)
    if not 1 <= value <= 4:
        raise argparse.ArgumentTypeError(f"{value} is not between 1 and 4")
    return value


def _add_data_arg(parser: argparse.ArgumentParser, what: str) -> None:
    """`--data`: fc-train JSON Lines files or directories of them, the bundled fc-train by default."""
    parser.add_argument("--data", nargs="+", default=[str(FC_TRAIN)], help=f"{what} (default: the bundled fc-train)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyfunc", description="Requests + tools -> function calls.")
    parser.add_argument("--version", action="version", version=f"hyfunc {hyfunc.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_answer_parsers(sub)
    _add_eval_parser(sub)
    from hyfunc.cli.bench_parsers import add_bench_parser  # here: it imports this module's helpers

    add_bench_parser(sub)
    _add_prepare_parser(sub)
    models = sub.add_parser("models", help="list the default models, or prepare (assemble + convert) them")
    models.add_argument("--prepare", nargs="+", metavar="NAME")
    models.set_defaults(handler=f"{COMMANDS}:cmd_models")
    _add_serve_parser(sub)
    _add_odia_parser(sub)
    return parser


def _add_method_args(parser: argparse.ArgumentParser, prefix_caching: bool) -> None:
    parser.add_argument("--method", default="hyfunc", choices=METHODS, help="answering method (default: the cascade)")
    parser.add_argument(
        "--artifact", help="cascade directory made by `hyfunc prepare` (method hyfunc; default: the shipped one)"
    )
    # No defaults here: an option given with a method it does not apply to is refused (checks.py).
    parser.add_argument(
        "--model", default=None, help=f"alias, local path or Hugging Face id (method direct; default {DEFAULT_LARGE})"
    )
    parser.add_argument("--style", default=None, choices=["auto", *PROMPT_STYLES], help="prompting style (method direct)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument(
        "--engine", default=DEFAULT_ENGINE, choices=ENGINES,
        help="inference engine of every model (default auto: llama.cpp for GGUF models on the CPU, the fastest measured, else transformers)",
    )
    parser.add_argument("--small-engine", choices=ENGINES, help="the cascade's small model on another engine")
    parser.add_argument(
        "--router", metavar="DIR|URL",
        help="route each request to the small path or the cascade (method hyfunc): a versions directory or "
        "PostgreSQL URL of `hyfunc odia cycle --out` (its champion) or one version",
    )
    parser.add_argument(
        "--prefix-caching", action=argparse.BooleanOptionalAction, default=prefix_caching,
        help="reuse the KV cache of the prompt prefix shared with the previous request (exact)",
    )


def _add_answer_parsers(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="answer a few requests against a sample tool library")
    _add_method_args(demo, prefix_caching=True)
    demo.set_defaults(handler=f"{COMMANDS}:cmd_demo")

    call = sub.add_parser("call", help="answer one request against tools from a JSON file")
    call.add_argument("--tools", required=True, help="JSON file: a list of tools (OpenAI, BFCL or JSON Schema) or {'tools': [...]}")
    call.add_argument("--query", required=True)
    call.add_argument("--timings", action="store_true", help="print the latency breakdown to stderr")
    call.add_argument(
        "--format", default="json", choices=CALL_FORMATS,
        help="json: {calls, error} (default); openai: an assistant message with tool_calls; python: [f(a=1)]",
    )
    call.add_argument("--traffic", nargs="?", const="", default=None, metavar="URL", help=TRAFFIC_HELP)
    _add_method_args(call, prefix_caching=True)
    call.set_defaults(handler=f"{COMMANDS}:cmd_call")


def _add_eval_parser(sub: argparse._SubParsersAction) -> None:
    evaluate = sub.add_parser("eval", help="benchmarks")
    eval_sub = evaluate.add_subparsers(dest="benchmark", required=True)
    bfcl = eval_sub.add_parser("bfcl", help="score on BFCL with the official checker")
    _add_method_args(bfcl, prefix_caching=False)
    _add_stage_switches(bfcl)
    bfcl.add_argument(
        "--categories", nargs="+",
        help=f"default: {' '.join(CATEGORIES)}; also {' '.join(EXTRA_CATEGORIES + list(ALIASES))}",
    )
    bfcl.add_argument("--limit", type=int, default=None, help="first N cases per category")
    bfcl.add_argument("--out", help="report directory (default: reports/<method>)")
    bfcl.add_argument("--data-dir", help="a data set laid out like BFCL's (question files + possible_answer/)")
    _add_side_by_side_args(bfcl)
    bfcl.set_defaults(handler=f"{BENCHMARKS}:cmd_eval_bfcl", needs=PLOTS)
    ood = eval_sub.add_parser(
        "ood", help="score on the out-of-distribution set: data sources held out of training (fc-train's, AgentDojo), "
        "BFCL's checker, a report per kind of value")
    _add_method_args(ood, prefix_caching=False)
    _add_stage_switches(ood)
    ood.add_argument("--data", nargs="+", default=[str(FC_TRAIN), str(OOD_DATA)],
                     help="files or directories holding the held-out sources (default: fc-train and hyfunc/data/ood)")
    ood.add_argument("--sources", nargs="+", default=list(HELD_OUT_SOURCES),
                     help=f"the held-out sources (default: {' '.join(HELD_OUT_SOURCES)}); train a cascade on the "
                     "others with `hyfunc prepare --data`")
    ood.add_argument("--per-source", type=int, default=60,
                     help="examples per source, balanced by call pattern, plus no-call cases made from them (default 60)")
    ood.add_argument("--seed", type=int, default=0)
    ood.add_argument("--out", default="reports/ood", help="report directory; the data set is written to its data/")
    _add_side_by_side_args(ood)
    ood.set_defaults(handler=f"{BENCHMARKS}:cmd_eval_ood", needs=PLOTS)
    answers = eval_sub.add_parser(
        "answers", help="final answers after tool results: are the results' key facts in the text reply?")
    _add_data_arg(answers, "fc-train files or directories (the validation split is used)")
    answers.add_argument("--per-source", type=int, default=10, help="conversations per source (default 10)")
    answers.add_argument("--model", default=DEFAULT_LARGE, help=f"the model writing the replies (default {DEFAULT_LARGE}, "
                         "the shipped cascade's large model, which writes its text replies)")
    answers.add_argument("--engine", default=DEFAULT_ENGINE, choices=ENGINES, help="engine (default auto, as the cascade's large model)")
    answers.add_argument("--device", default=None)
    answers.add_argument("--max-tokens", type=int, default=200)
    answers.add_argument("--out", default="reports/final-answers", help="where final_answers.{json,png}, README.md go")
    answers.set_defaults(handler=f"{BENCHMARKS}:cmd_eval_answers", needs=PLOTS)
    compare = eval_sub.add_parser("compare", help="merge several BFCL runs into one table and plot")
    compare.add_argument("runs", nargs="+", help="report directories of `hyfunc eval bfcl`")
    compare.add_argument("--out", required=True, help="where comparison.{json,md,png} go")
    compare.set_defaults(handler=f"{BENCHMARKS}:cmd_eval_compare", needs=PLOTS)


def _add_stage_switches(parser: argparse.ArgumentParser) -> None:
    # Stage switches are experiments: only the benchmarks take them, not demo, call or serve.
    parser.add_argument(
        "--ablate", nargs="+", default=[], choices=ABLATABLE, help="switch these cascade stages off (method hyfunc)",
    )


def _add_side_by_side_args(parser: argparse.ArgumentParser) -> None:
    """What `eval bfcl` and `eval ood` share: resuming, and the methods run beside the main one."""
    parser.add_argument("--no-resume", action="store_true", help="start over instead of skipping cases already scored")
    parser.add_argument(
        "--with-direct", nargs="+", default=[], metavar="MODEL",
        help="also answer every case by direct prompting with these models (MODEL or MODEL@ENGINE), "
        "interleaved with the main method (side by side); the first is the baseline of the latency ratios",
    )
    parser.add_argument(
        "--with-cascade", nargs="+", default=[], metavar="ARTIFACT",
        help="also answer every case with these prepared cascades, side by side: ARTIFACT, ARTIFACT@ENGINE or "
        "ARTIFACT@LARGE_ENGINE,SMALL_ENGINE ('shipped' = the shipped one)",
    )
    parser.add_argument(
        "--ablations", nargs="+", default=[], type=ablation_spec, metavar="STAGE[+STAGE]",
        help=f"also run the cascade with each of these stages switched off, one variant each; STAGE+STAGE: "
        f"a variant with both off (stages: {', '.join(ABLATABLE)})",
    )


def _add_prepare_parser(sub: argparse._SubParsersAction) -> None:
    prep = sub.add_parser("prepare", help="train a cascade (embeddings, retriever, small model); resumable")
    prep.add_argument("--large", default=DEFAULT_LARGE, help="large model (soft token, function embeddings)")
    prep.add_argument("--small", default=DEFAULT_SMALL, help="small model (writes the argument values)")
    _add_data_arg(prep, "training JSON Lines files or directories (never BFCL)")
    prep.add_argument("--out", required=True, help="artifact directory (re-run the same command to resume)")
    prep.add_argument("--epochs", type=int, default=1, help="small-model fine-tuning epochs")
    prep.add_argument("--lora-rank", type=int, default=16, help="LoRA rank of the small model; 0 trains the projector only")
    prep.add_argument("--max-examples", type=int, default=None, help="a seeded sample of N examples, balanced by call pattern")
    prep.add_argument("--sft-max-items", type=int, default=None, help="fine-tune the small model on N items, balanced by call pattern")
    prep.add_argument(
        "--schema-variants", type=float, default=0.0, metavar="FRACTION",
        help="add this fraction of training requests again under other spellings of their tools' schemas (renamed, "
        "reordered, described, nested, batched parameters; hyfunc/cascade/schema_variants.py)",
    )
    prep.add_argument(
        "--repeat-fraction", type=float, default=0.0,
        help="add this fraction of repeated-call examples, joined from single-call requests of the data (BFCL's parallel case)",
    )
    prep.add_argument(
        "--no-off-topic-gate", action="store_true",
        help="skip the off-topic gate, which refuses small talk (about 400 large-model passes)",
    )
    prep.add_argument("--gate-only", action="store_true",
                      help="only (re)train the off-topic gate of the cascade already in --out, on --data")
    prep.add_argument("--next-step-only", action="store_true",
                      help="only (re)train the next-step head (answer or call after a tool result) of the cascade in --out")
    prep.add_argument("--agent-only", action="store_true",
                      help="go on training the small model and the next-step head of the cascade in --out on agent "
                      "conversations (calls made, results, the calls left; chained requests)")
    prep.add_argument("--per-source", type=int, default=30,
                      help="next-step head: agent conversations of each kind (answer, call) per data source; 0: no head")
    prep.add_argument("--chained-per-source", type=int, default=15,
                      help="--agent-only: chained requests per data source (the second call needs a value the first returns)")
    prep.add_argument("--joined-per-source", type=int, default=15,
                      help="--agent-only: pairs of independent requests asked at once per data source (every call due at once)")
    prep.add_argument("--agent-items", type=int, default=240, help="--agent-only: agent conversations trained on (a sample)")
    prep.add_argument("--agent-kinds", nargs="+", default=list(STEP_KINDS), choices=STEP_KINDS,
                      help="--agent-only: the kinds of conversation the small model learns from (the head learns from all)")
    prep.add_argument("--after-results-model", action="store_true",
                      help="--agent-only: train a second small model used only after tool results (after_results/), "
                      "leaving the one that answers requests as it was (needs --agent-kinds after_results)")
    prep.add_argument("--replay", type=int, default=80, help="--agent-only: single-turn items trained beside them")
    prep.add_argument("--engine", default="auto", help="--next-step-only, --agent-only: engine of the large model's passes")
    prep.add_argument("--report", default=None, help="next-step head: also write its held-out report to this directory")
    prep.add_argument("--library", default=None, help="a large tool library (JSON Lines): also train its per-function retriever")
    prep.add_argument("--seed", type=int, default=0)
    prep.set_defaults(handler=f"{COMMANDS}:cmd_prepare", needs=TRAINING)


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve", help="OpenAI-compatible server: POST /v1/chat/completions with tools -> tool_calls",
        description="Serve Chat Completions with tools. Decoding is greedy: temperature and top_p are accepted and ignored.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--method", default="hyfunc", choices=METHODS, help="answering method (default: the cascade)")
    serve.add_argument("--artifact", help="cascade directory made by `hyfunc prepare` (default: the shipped one)")
    serve.add_argument("--model", default=DEFAULT_LARGE, help="model of method direct: alias, local path or Hugging Face id")
    serve.add_argument("--style", default="auto", choices=["auto", *PROMPT_STYLES], help="prompting style (method direct)")
    serve.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    serve.add_argument("--engine", default=DEFAULT_ENGINE, choices=ENGINES, help=f"inference engine (default: {DEFAULT_ENGINE})")
    serve.add_argument("--small-engine", choices=ENGINES, help="the cascade's small model on another engine")
    serve.add_argument("--served-model-name", default="hyfunc", help="the model id clients send (default: hyfunc)")
    serve.add_argument(
        "--api-key", default=os.environ.get("HYFUNC_API_KEY") or None,
        help="require 'Authorization: Bearer KEY' on /v1 (default: $HYFUNC_API_KEY; none: no key)",
    )
    serve.add_argument("--max-queue", type=int, default=16, help="requests waiting beyond the running one; then 429")
    serve.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="larger bodies get 413")
    serve.add_argument("--request-timeout", type=float, default=300.0, help="seconds per request, queue included; then 504")
    serve.add_argument("--max-tokens", type=int, default=2048, help="cap on a text reply's max_tokens")
    serve.add_argument(
        "--max-tools", type=int, default=10_000,
        help="most tools per request; more get 400. Over 128 a library is read per function (the cascade "
        "with a library retriever; the first request with it embeds every tool, cached on disk)",
    )
    serve.add_argument(
        "--library-cache", type=int, default=8,
        help="tool libraries whose large-model state (KV cache, embeddings) the cascade keeps, LRU (0: off)",
    )
    serve.add_argument("--library-cache-mb", type=int, default=2048, help="memory bound of that cache")
    serve.add_argument(
        "--library-disk-cache-mb", type=int, default=2048, metavar="MB",
        help="disk bound of the per-function library embeddings in $HYFUNC_HOME/library-embeddings; the least "
        "recently used libraries are deleted first, never one in use (default 2048)",
    )
    serve.add_argument(
        "--max-new-tool-tokens", type=int, default=32_768, metavar="N",
        help="413 for a request whose tool library is in no cache (memory or disk) and whose tools' JSON schemas take "
        "more than N tokens of the model's tokenizer: reading them costs model time in proportion (default 32768; 0: no cap)",
    )
    serve.add_argument(
        "--ready-max-wait", type=float, default=30.0, metavar="SECONDS",
        help="/health/ready answers 503 'degraded' while the oldest queued request has waited longer (default 30)",
    )
    serve.add_argument(
        "--library-jobs", type=int, default=2, metavar="N",
        help="a new library of more than 128 tools is embedded between requests, up to N at once, its requests "
        "answered 429 with Retry-After meanwhile (default 2; 0: embedded on the request path, holding the worker)",
    )
    serve.add_argument(
        "--batch", type=_batch_size, default=1, metavar="N",
        help="run up to N requests together, their model steps batched, when they can be: the cascade on llama.cpp, "
             "over the same tool library already held (default 1: one request at a time; at most 4)",
    )
    serve.add_argument("--traffic", nargs="?", const="", default=None, metavar="URL", help=TRAFFIC_HELP)
    serve.add_argument("--traffic-keep-days", type=float, default=None, metavar="DAYS",
                       help="with --traffic: delete logged requests older than DAYS days, at start and then every "
                       "5 minutes (default: keep everything)")
    serve.add_argument("--traffic-keep-rows", type=int, default=None, metavar="N",
                       help="with --traffic: keep only the newest N logged requests, pruned at start and then every "
                       "5 minutes (default: keep everything)")
    serve.add_argument(
        "--router", metavar="DIR|URL",
        help="route each request to the small path or the cascade (method hyfunc): a versions directory or "
        "PostgreSQL URL of `hyfunc odia cycle --out` (its champion, promotions picked up live) or one version",
    )
    serve.add_argument(
        "--explore", type=float, default=0.05,
        help="with --router: share of the requests routed to the small path answered by the cascade anyway, so that "
        "the traffic log keeps the large path's answers for the next cycles (default 0.05)",
    )
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(handler=f"{COMMANDS}:cmd_serve", needs=SERVER)


def _add_odia_parser(sub: argparse._SubParsersAction) -> None:
    odia = sub.add_parser("odia", help="learning from traffic: the traffic log, feedback, routing")
    odia_sub = odia.add_subparsers(dest="odia_command", required=True)

    feedback = odia_sub.add_parser("feedback", help="mark a logged answer good or bad")
    feedback.add_argument("request_id", help="the id the server returned with the answer")
    feedback.add_argument("verdict", choices=FEEDBACK)
    feedback.add_argument("--store", default=None, help=STORE_HELP)
    feedback.set_defaults(handler=f"{ODIA}:cmd_feedback")

    stats = odia_sub.add_parser("stats", help="what the traffic log holds: requests per path and library, feedback")
    stats.add_argument("--store", default=None, help=STORE_HELP)
    stats.add_argument("--json", action="store_true", help="machine-readable output")
    stats.set_defaults(handler=f"{ODIA}:cmd_stats")

    prune = odia_sub.add_parser("prune", help="delete logged requests beyond a retention limit, with their feedback")
    prune.add_argument("--keep-days", type=float, default=None, metavar="DAYS", help="keep the requests of the last DAYS days")
    prune.add_argument("--keep-rows", type=int, default=None, metavar="N", help="keep at most the newest N requests")
    prune.add_argument("--store", default=None, help=STORE_HELP)
    prune.set_defaults(handler=f"{ODIA}:cmd_prune")

    forget = odia_sub.add_parser("forget", help="delete logged requests by id, with their feedback")
    forget.add_argument("request_ids", nargs="+", metavar="REQUEST_ID", help="ids the server returned with the answers")
    forget.add_argument("--store", default=None, help=STORE_HELP)
    forget.set_defaults(handler=f"{ODIA}:cmd_forget")

    train = odia_sub.add_parser("train-router", help="train the router on mined labels (see hyfunc.routing.mining)")
    train.add_argument("--store", default=None, help=STORE_HELP)
    train.add_argument("--out", required=True, help="router directory (router.safetensors + router.json)")
    train.add_argument("--target", type=float, default=0.99,
                       help="agreement with the large path to keep on held-out traffic (default 0.99)")
    train.add_argument("--holdout", type=float, default=0.3,
                       help="the newest share of labelled traffic, held out to choose the threshold")
    train.add_argument("--with-small-answer", action="store_true",
                       help="also read the small path's answer (calls, confidence): route after it has run")
    train.set_defaults(handler=f"{ODIA}:cmd_train_router")

    selector = odia_sub.add_parser("selector", help="train and calibrate the small path's tool selector (MiniLM + BM25) on fc-train")
    _add_data_arg(selector, "fc-train files or directories (never BFCL)")
    selector.add_argument("--out", required=True, help="selector directory")
    selector.add_argument("--identity", action="store_true", help="no training: MiniLM's cosine as it is, calibrated")
    selector.add_argument("--epochs", type=int, default=30)
    selector.add_argument("--seed", type=int, default=0)
    selector.set_defaults(handler=f"{ODIA}:cmd_selector")

    _add_odia_cycle_parser(odia_sub)

    status = odia_sub.add_parser("status", help="versions, the champion and their held-out metrics")
    status.add_argument("--dir", default=None, help="versions directory or PostgreSQL URL (default: $HYFUNC_HOME/odia)")
    status.set_defaults(handler=f"{ODIA}:cmd_status")

    rollback = odia_sub.add_parser("rollback", help="make the previous champion the champion again")
    rollback.add_argument("--dir", default=None, help="versions directory or PostgreSQL URL (default: $HYFUNC_HOME/odia)")
    rollback.set_defaults(handler=f"{ODIA}:cmd_rollback")


def _add_odia_cycle_parser(odia_sub: argparse._SubParsersAction) -> None:
    cycle = odia_sub.add_parser("cycle", help="one gated update: distil -> mine -> router -> replay held-out traffic -> promote if not worse")
    cycle.add_argument("--store", default=None, help=STORE_HELP)
    cycle.add_argument("--artifact", default=None, help="the served cascade (its small model and adapter; default: the shipped one)")
    cycle.add_argument("--out", default=None, help="versions directory, or a PostgreSQL URL that replicas share (default: "
                       "$HYFUNC_HOME/odia); serve it with --router")
    cycle.add_argument("--every", default=None, metavar="PERIOD", help="run again every PERIOD (seconds, or 30m, 1h, 1d)")
    cycle.add_argument("--window", default=None, metavar="PERIOD", help="only the traffic of the last PERIOD (default: all)")
    cycle.add_argument("--target", type=float, default=0.99, help="agreement with the large path to keep (default 0.99)")
    cycle.add_argument("--holdout", type=float, default=0.2, help="newest share of the window held out for the gate")
    cycle.add_argument("--small-first", action="store_true",
                       help="a router that reads the small path's answer (its confidence): served, every request runs "
                            "the small path first and only doubtful answers go on to the cascade")
    cycle.add_argument("--min-requests", type=int, default=100, help="fewer large-path requests: skip the cycle")
    cycle.add_argument("--replay-data", nargs="*", default=[], help="fc-train files: a replay sample mixed into distillation")
    cycle.add_argument("--replay-fraction", type=float, default=0.5, help="replay examples per teacher example")
    cycle.add_argument("--distil-on", choices=("all", "agreed", "none"), default="all",
                       help="teacher answers to distil: all, those the current small path already reproduces, "
                            "or none (keep the small model, retrain the router)")
    cycle.add_argument("--labelled", type=int, default=0, metavar="N",
                       help="also score the small path against gold on N fc-train validation requests (from "
                            "--replay-data); the gate refuses a candidate that loses accuracy there")
    cycle.add_argument("--selector", default=None, help="the first version's tool selector (default: the shipped one)")
    cycle.add_argument("--engine", default="transformers", help="engine the small path is measured on (as served)")
    cycle.add_argument("--epochs", type=int, default=1, help="distillation epochs")
    cycle.add_argument("--lora-rank", type=int, default=16, help="rank of a new adapter (a warm start keeps its own)")
    cycle.add_argument("--max-items", type=int, default=None, help="distil on at most N teacher answers")
    cycle.add_argument("--agreement-tolerance", type=float, default=0.005)
    cycle.add_argument("--accuracy-tolerance", type=float, default=0.01)
    cycle.add_argument("--latency-tolerance", type=float, default=0.05, help="relative growth of mean latency allowed")
    cycle.add_argument("--json", action="store_true", help="print each cycle's report as JSON")
    cycle.set_defaults(handler=f"{ODIA}:cmd_cycle")
