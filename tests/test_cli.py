"""The command line's clear errors: one line on stderr, exit status 2, before any model loads.

Every case goes through the entry point `main([...])`, as a user's command would.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hyfunc.cli import USER_ERRORS, main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TOOLS = str(EXAMPLES / "tools.json")


def run(capsys, *argv: str) -> tuple[int, str]:
    """(exit status, stderr) of `hyfunc argv`; the error must be exactly one line."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err  # that line and nothing else
    return code, err.strip()


def test_version_is_the_installed_distributions(capsys):
    from importlib import metadata

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"hyfunc {metadata.version('hyfunc')}\n"


def test_version_of_a_source_tree_never_installed(monkeypatch):
    from importlib import metadata

    import hyfunc

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert hyfunc._version() == "0+unknown"


def test_models_lists_the_default_aliases(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for alias in ("qwen-coder-1.5b", "qwen-coder-0.5b", "smollm2-135m"):
        assert alias in out


@pytest.mark.parametrize(
    "model, message",
    [
        ("qwen-coder-15b", "unknown model 'qwen-coder-15b': not a default alias (qwen-coder-1.5b, qwen-coder-0.5b, smollm2-135m)"),
        ("./no/such/dir", "unknown model './no/such/dir'"),
        ("missing.gguf", "unknown model 'missing.gguf'"),
    ],
)
def test_unknown_model_lists_the_aliases(capsys, model, message):
    code, err = run(capsys, "call", "--method", "direct", "--model", model, "--tools", TOOLS, "--query", "hi")
    assert code == 2 and message in err


def test_model_directory_without_config(capsys, tmp_path):
    code, err = run(capsys, "call", "--method", "direct", "--model", str(tmp_path), "--tools", TOOLS, "--query", "hi")
    assert code == 2 and "holds no config.json" in err


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json at all", "is not JSON"),
        ("42", "holds a number; expected a JSON list of tools"),
        ('"get_weather"', "holds a string; expected a JSON list of tools"),
        ('{"functions": []}', 'the object has no "tools" key (keys: \'functions\')'),
        ("[]", "holds no tools"),
        ('{"tools": {"name": "f"}}', "holds an object; expected"),
        ('[{"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "strng"}}}}]', "'f'"),
    ],
)
def test_bad_tools_files(capsys, tmp_path, content, message):
    path = tmp_path / "tools.json"
    path.write_text(content)
    code, err = run(capsys, "call", "--tools", str(path), "--query", "hi")
    assert code == 2 and message in err and str(path) in err


def test_missing_tools_file(capsys, tmp_path):
    code, err = run(capsys, "call", "--tools", str(tmp_path / "missing.json"), "--query", "hi")
    assert code == 2 and "missing.json' does not exist" in err


def test_unsupported_category_lists_the_supported_ones(capsys):
    code, err = run(capsys, "eval", "bfcl", "--method", "direct", "--categories", "simple_java_typo")
    assert code == 2
    assert "unsupported BFCL category 'simple_java_typo'; supported: simple_python" in err and "live_relevance" in err


def test_the_loader_and_the_command_line_share_one_category_list():
    from hyfunc.cli.checks import check_bfcl_inputs
    from hyfunc.eval import bfcl

    # "simple" (the v3 name) and "live_relevance" are read by the loader: the CLI accepts them too.
    assert check_bfcl_inputs(["simple", "live_relevance"], None) == ["simple_python", "live_relevance"]
    assert bfcl.CATEGORIES is __import__("hyfunc.formats.bfcl", fromlist=["CATEGORIES"]).CATEGORIES


def test_data_dir_missing_empty_or_without_the_category(capsys, tmp_path):
    code, err = run(capsys, "eval", "bfcl", "--method", "direct", "--data-dir", str(tmp_path / "nope"))
    assert code == 2 and "is not a directory" in err
    code, err = run(capsys, "eval", "bfcl", "--method", "direct", "--data-dir", str(tmp_path))
    assert code == 2 and "holds no .json question file" in err
    (tmp_path / "BFCL_v4_multiple.json").write_text("")
    code, err = run(capsys, "eval", "bfcl", "--method", "direct", "--data-dir", str(tmp_path), "--categories", "simple_python")
    assert code == 2 and "no question file for category 'simple_python'" in err


def test_missing_bfcl_eval_says_how_to_install(capsys, monkeypatch):
    # A None entry in sys.modules is how Python marks a module as absent: find_spec and import fail.
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)
    code, err = run(capsys, "eval", "bfcl", "--method", "direct", "--categories", "multiple")
    assert code == 2 and "bfcl-eval) is not installed; install it with: pip install --no-deps bfcl-eval==" in err


@pytest.mark.parametrize(("absent", "argv", "extra"), [
    ("matplotlib", ["eval", "compare", "a", "--out", "b"], "eval"),
    ("uvicorn", ["serve"], "serve"),
    ("psycopg_pool", ["odia", "stats", "--store", "postgresql://u@127.0.0.1:1/db"], "postgres"),
    ("chatterbot_corpus", ["prepare", "--out", "x"], "train"),
])
def test_a_missing_extra_names_the_extra_that_installs_it(capsys, monkeypatch, absent, argv, extra):
    monkeypatch.setitem(sys.modules, absent, None)  # absent, as an uninstalled module is
    code, err = run(capsys, *argv)
    assert code == 2 and f"needs {absent}, which is not installed: pip install 'hyfunc[{extra}]'" in err


def test_bad_device(capsys):
    code, err = run(capsys, "call", "--method", "direct", "--device", "gpu", "--tools", TOOLS, "--query", "hi")
    assert code == 2 and "unknown device 'gpu'; use cpu or cuda" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu(capsys):
    code, err = run(capsys, "demo", "--method", "direct", "--device", "cuda")
    assert code == 2 and "no CUDA GPU is visible" in err


def test_models_prepare_of_an_unknown_name_fails(capsys):
    code, err = run(capsys, "models", "--prepare", "qwen-coder-7b")
    assert code == 2 and "cannot prepare 'qwen-coder-7b'" in err and "qwen-coder-1.5b" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["call", "--tools", TOOLS, "--query", "hi", "--model", "smollm2-135m"], "--model applies to --method direct only"),
        (["demo", "--style", "native"], "--style applies to --method direct only"),
        (["demo", "--method", "direct", "--artifact", "x"], "--artifact applies to --method hyfunc only"),
        (["eval", "bfcl", "--method", "direct", "--ablate", "retriever", "--categories", "multiple"],
         "--ablate applies to --method hyfunc only"),
        (["eval", "bfcl", "--method", "direct", "--ablations", "retriever", "--categories", "multiple"],
         "--ablations applies to --method hyfunc only"),
        (["eval", "bfcl", "--method", "direct", "--with-cascade", "x", "--categories", "multiple"],
         "--with-cascade applies to --method hyfunc only"),
    ],
)
def test_options_of_the_other_method_are_refused(capsys, argv, message):
    code, err = run(capsys, *argv)
    assert code == 2 and message in err


@pytest.mark.parametrize("command", [["demo"], ["call", "--tools", TOOLS, "--query", "hi"], ["serve"]])
def test_stage_switches_are_for_the_benchmarks_only(capsys, command):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--ablate", "retriever"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --ablate retriever" in capsys.readouterr().err


def test_missing_artifact_directory_is_a_clear_error(tmp_path, capsys):
    code, err = run(capsys, "eval", "bfcl", "--artifact", str(tmp_path), "--categories", "simple_python")
    assert code == 2 and "not a prepared cascade (run `hyfunc prepare`)" in err
    code, err = run(capsys, "eval", "bfcl", "--with-cascade", str(tmp_path), "--categories", "simple_python")
    assert code == 2 and "not a prepared cascade" in err
    code, err = run(capsys, "bench", "library", "--artifact", str(tmp_path), "--data", str(EXAMPLES / "train.jsonl"))
    assert code == 2 and "not a prepared cascade" in err


def test_unknown_baseline_model_is_refused_before_the_cascade_loads(capsys):
    code, err = run(capsys, "eval", "bfcl", "--with-direct", "qwen-coder-1.5b", "qwen-coder-05b", "--categories", "multiple")
    assert code == 2 and "unknown model 'qwen-coder-05b'" in err
    code, err = run(capsys, "bench", "library", "--with-direct", "qwen-15b", "--data", str(EXAMPLES / "train.jsonl"))
    assert code == 2 and "unknown model 'qwen-15b'" in err


def test_prepare_with_missing_or_empty_data(tmp_path, capsys):
    code, err = run(capsys, "prepare", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "a"))
    assert code == 2 and f"--data {tmp_path / 'nope'}: no such file or directory" in err
    code, err = run(capsys, "prepare", "--data", str(tmp_path), "--out", str(tmp_path / "a"))
    assert code == 2 and "holds no .jsonl file" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "1", "query": "q", "tools": [], "answers": [{"name": "f"}]}) + "\n")
    code, err = run(capsys, "prepare", "--data", str(bad), "--out", str(tmp_path / "a"))
    assert code == 2 and "bad.jsonl:1: answer calls 'f', which is not among the tools" in err


DATA_COMMANDS = [
    ["prepare", "--out", "unused"], ["bench", "library"], ["bench", "retriever"], ["bench", "small-retrieval"],
    ["bench", "odia"], ["bench", "refusal"], ["bench", "serve", "--url", "http://127.0.0.1:1"], ["bench", "isolation", "--url", "http://127.0.0.1:1"],
    ["odia", "selector", "--out", "unused"],
]


@pytest.mark.parametrize("command", DATA_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_the_bundled_training_data_is_the_default(command):
    from hyfunc.cli.parsers import build_parser
    from hyfunc.data import FC_TRAIN

    assert build_parser().parse_args(command).data == [str(FC_TRAIN)]


def test_the_retriever_benchmark_reads_the_bundled_library_by_default():
    from hyfunc.cli.parsers import build_parser
    from hyfunc.data import TOOL_LIBRARY

    assert build_parser().parse_args(["bench", "retriever"]).library == str(TOOL_LIBRARY)


def test_prepare_runs_without_data(tmp_path, capsys):
    # No --data: argparse takes the default, and the command goes on to its own checks.
    code, err = run(capsys, "prepare", "--gate-only", "--out", str(tmp_path))
    assert code == 2 and "is not a prepared cascade" in err


@pytest.mark.parametrize("command", DATA_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_missing_data_says_how_to_get_data(capsys, command):
    code, err = run(capsys, *command, "--data", "nope.jsonl")
    assert code == 2 and err == (
        "error: --data nope.jsonl: no such file or directory; the bundled training data is the default "
        "(omit --data), or give JSON Lines files of query/tools/answers"
    )


@pytest.mark.parametrize("command", [["bench", "retriever"], ["bench", "odia"], ["prepare", "--out", "unused"]])
def test_missing_library_is_a_clear_error(capsys, command):
    code, err = run(capsys, *command, "--library", "nope.jsonl")
    assert code == 2 and err.startswith("error: --library nope.jsonl: no such file or directory; give JSON Lines")


def test_bad_thread_count(capsys, monkeypatch):
    monkeypatch.setenv("HYFUNC_THREADS", "two")
    code, err = run(capsys, "call", "--method", "direct", "--model", "qwen-coder-0.5b", "--tools", TOOLS, "--query", "hi")
    assert code == 2 and "HYFUNC_THREADS='two'" in err


def test_bugs_are_not_mistaken_for_user_errors():
    # A plain ValueError or KeyError raised by a bug keeps its traceback: only UserError (and a
    # missing file named on the command line) is turned into one line.
    assert not issubclass(ValueError, USER_ERRORS) and not issubclass(KeyError, USER_ERRORS)
    assert not issubclass(RuntimeError, USER_ERRORS)


def test_prepare_on_the_three_line_example_says_it_is_too_little(tmp_path, capsys):
    code, err = run(capsys, "prepare", "--data", str(EXAMPLES / "train.jsonl"), "--out", str(tmp_path / "a"))
    assert code == 2 and "too little data: 3 training and 0 validation examples" in err


def test_ablations_take_stages_joined_by_plus(capsys):
    from hyfunc.cli.parsers import ablation_spec

    assert ablation_spec("large_choices+large_numbers") == "large_choices+large_numbers"
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "bfcl", "--ablations", "large_values+nope", "--categories", "multiple"])
    assert exit_info.value.code == 2 and "unknown stage 'nope'" in capsys.readouterr().err


#: What answering loads; `hyfunc --help` and a typo must not wait for it.
HEAVY_MODULES = ("torch", "transformers", "numpy", "fastapi", "uvicorn", "psycopg", "matplotlib", "peft", "llama_cpp")

EVERY_HELP = """
import argparse, contextlib, io, sys
from hyfunc.cli import main
from hyfunc.cli.parsers import build_parser

def format_helps(parser):
    parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                format_helps(command)

format_helps(build_parser())
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(["--help"])
print(" ".join(sorted(set(HEAVY) & set(sys.modules))))
"""


def test_the_parser_and_its_help_import_no_model_code():
    # A fresh interpreter: this test process has imported torch already.
    script = f"HEAVY = {HEAVY_MODULES!r}\n{EVERY_HELP}"
    run = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "", f"imported by building the parser: {run.stdout.strip()}"
