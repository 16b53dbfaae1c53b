"""The command line: argument handling and clear errors (no model is loaded here)."""
import json

from hyfunc.cli import main


def test_models_lists_the_default_aliases(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for alias in ("qwen-coder-1.5b", "qwen-coder-0.5b", "smollm2-135m"):
        assert alias in out


def test_call_with_unreadable_or_invalid_tools_fails_cleanly(tmp_path, capsys):
    assert main(["call", "--tools", str(tmp_path / "missing.json"), "--query", "hi"]) == 2
    assert "cannot read tools" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "strng"}}}}]))
    assert main(["call", "--tools", str(bad), "--query", "hi"]) == 2
    err = capsys.readouterr().err
    assert "'f'" in err and "strng" in err


def test_eval_rejects_unknown_categories_before_loading_a_model(capsys):
    assert main(["eval", "bfcl", "--method", "direct", "--model", "smollm2-135m", "--categories", "simple_java_typo"]) == 2
    assert "unknown categories" in capsys.readouterr().err


def test_ablations_need_the_cascade(capsys):
    assert main(["eval", "bfcl", "--method", "direct", "--ablations", "retriever", "--categories", "simple_python"]) == 2
    assert "--method hyfunc" in capsys.readouterr().err


def test_missing_artifact_directory_is_a_clear_error(tmp_path, capsys):
    assert main(["eval", "bfcl", "--method", "hyfunc", "--artifact", str(tmp_path), "--categories", "simple_python"]) == 2
    assert "hyfunc prepare" in capsys.readouterr().err
