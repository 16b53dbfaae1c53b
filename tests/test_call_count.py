"""The call-count head: a calibrated lower bound on the number of calls, read off the soft token."""
import pytest
import torch

from hyfunc.cascade.call_count import CallCountHead, calibrate, count_class, train_call_count_head

HIDDEN = 16


def toy(n: int, seed: int, noise: float) -> tuple[torch.Tensor, list[int]]:
    """Soft tokens whose first coordinate says how many calls (1..5), other coordinates noise (large
    and offset, as in hidden states: the head standardises them)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 6, (n,), generator=g)
    x = 50 + 30 * torch.randn(n, HIDDEN, generator=g)
    x[:, 0] = counts.float() + noise * torch.randn(n, generator=g)
    return x, counts.tolist()


def test_a_trained_head_bounds_held_out_requests_without_overshooting():
    x, counts = toy(400, seed=0, noise=0.1)
    head = train_call_count_head(x, counts, l2=1e-3)
    vx, vcounts = toy(200, seed=1, noise=0.1)
    metrics = calibrate(head, vx, vcounts)
    assert metrics["bounded_too_high"] == 0 and 0.5 <= head.threshold < 1.0
    assert metrics["argmax_accuracy"] > 0.9
    tx, tcounts = toy(200, seed=2, noise=0.1)
    bounds = head.lower_bounds(tx)
    assert all(1 <= b <= min(c, 4) for b, c in zip(bounds, tcounts))  # never above the truth (4 = "4 or more")
    assert sum(b == min(c, 4) for b, c in zip(bounds, tcounts)) > 150  # and mostly exact


def test_a_head_that_cannot_tell_never_raises_the_bound():
    x, counts = toy(400, seed=0, noise=0.1)
    head = train_call_count_head(x, counts, l2=1e-3)
    vx, vcounts = toy(200, seed=1, noise=0.1)
    reversed_counts = [6 - c for c in vcounts]  # validation disagrees with everything it learned
    metrics = calibrate(head, vx, reversed_counts, grid=[0.5, 0.9])
    assert head.threshold is None and metrics["raised_above_one"] == 0
    assert head.lower_bounds(vx) == [1] * 200


def test_save_and_load_give_the_same_bounds(tmp_path):
    x, counts = toy(300, seed=0, noise=0.3)
    head = train_call_count_head(x, counts)
    calibrate(head, *toy(100, seed=1, noise=0.3))
    head.save(tmp_path / "cc", meta={"metrics": {"a": 1}})
    loaded = CallCountHead.load(tmp_path / "cc")
    assert loaded.threshold == head.threshold and loaded.meta == {"metrics": {"a": 1}}
    assert loaded.lower_bounds(x) == head.lower_bounds(x)
    assert loaded.at_least(x[0]) == head.lower_bounds(x[:1])[0]


def test_bad_inputs_are_refused(tmp_path):
    with pytest.raises(ValueError, match="call a tool"):
        count_class(0)
    with pytest.raises(ValueError, match="training requests"):
        train_call_count_head(torch.zeros(0, HIDDEN), [])
    with pytest.raises(FileNotFoundError, match="call-count head"):
        CallCountHead.load(tmp_path)
