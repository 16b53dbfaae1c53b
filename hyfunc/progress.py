"""Progress for long steps that have no natural unit of work (loading models, reading a library
into a KV cache): a bar whose clock ticks every second from the start, so a user sees at once
that something runs, which step it is, and for how long already."""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Iterator

from tqdm.auto import tqdm


class Steps:
    """A bar over named steps; `next(name)` finishes the current step and names the next."""

    def __init__(self, bar: tqdm) -> None:
        self._bar = bar
        self._started = False

    def next(self, name: str) -> None:
        if self._started:
            self._bar.update(1)
        self._started = True
        self._bar.set_postfix_str(name)


@contextmanager
def steps(desc: str, total: int, tick_seconds: float | None = None) -> Iterator[Steps]:
    """A bar of `total` steps, redrawn every `tick_seconds` (default: 1 s on a terminal, 30 s in a
    log file, where each redraw is a line) so its elapsed time keeps moving during a long step."""
    if tick_seconds is None:
        tick_seconds = 1.0 if sys.stderr.isatty() else 30.0
    bar = tqdm(total=total, desc=desc, unit="step", bar_format="{desc}: {n_fmt}/{total_fmt} [{elapsed}] {postfix}")
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(tick_seconds):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    tracker = Steps(bar)
    try:
        yield tracker
        if tracker._started:
            bar.update(1)
    finally:
        stop.set()
        ticker.join()
        bar.close()
