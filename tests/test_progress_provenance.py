"""Progress bars that tick from the first second, and the provenance every report records."""
import subprocess
import time

from hyfunc.eval.machine import SPEED_FLAGS, cpu_info, git_state
from hyfunc.eval.provenance import provenance, provenance_markdown
from hyfunc.progress import steps


def test_a_long_step_is_shown_at_once_and_its_clock_keeps_moving(capsys):
    with steps("reading the library", total=2, tick_seconds=0.05, delay=0.05) as progress:
        progress.next("cascade")
        time.sleep(0.4)  # one long step: no update, only the ticker redraws
        progress.next("direct")
    err = capsys.readouterr().err
    assert "reading the library: 0/2" in err and "cascade" in err
    assert err.count("cascade") >= 4  # redrawn while the step ran
    assert "reading the library: 2/2" in err


def test_a_step_that_fails_at_once_prints_no_bar(capsys):
    try:
        with steps("loading models", total=1) as progress:
            progress.next("models")
            raise KeyError("fails before the bar's one-second delay")
    except KeyError:
        pass
    assert capsys.readouterr().err == ""


def test_a_failure_after_the_bar_appeared_ends_its_line(capsys):
    try:
        with steps("loading models", total=1, tick_seconds=0.05, delay=0.05) as progress:
            progress.next("models")
            time.sleep(0.2)
            raise KeyError("late")
    except KeyError:
        pass
    assert capsys.readouterr().err.endswith("\n")


def test_git_state_of_a_repository_and_of_a_plain_folder(tmp_path):
    assert git_state(tmp_path) == {"commit": None, "dirty": None}
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    (tmp_path / "a.txt").write_text("1")
    subprocess.run(git + ["add", "a.txt"], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    clean = git_state(tmp_path)
    assert len(clean["commit"]) == 40 and clean["dirty"] is False
    (tmp_path / "untracked.txt").write_text("x")  # does not change what ran
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "a.txt").write_text("2")
    assert git_state(tmp_path) == {"commit": clean["commit"], "dirty": True}


def test_provenance_without_methods_describes_code_and_machine():
    record = provenance()
    assert set(record) >= {"git", "cpu", "torch", "torch_threads", "models", "artifacts"}
    cpu = cpu_info()
    assert cpu["cores"] >= 1 and (cpu["speed_flags"] is None or set(cpu["speed_flags"]) <= set(SPEED_FLAGS))
    line = provenance_markdown(record)
    assert line.startswith("Provenance: commit ") and "threads" in line and "\n" not in line
    assert provenance_markdown(None).startswith("Provenance: not recorded")
