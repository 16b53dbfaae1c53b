"""Progress for long steps that have no natural unit of work (loading models, reading a library
into a KV cache): a bar whose clock ticks every second, so a user sees that something runs, which
step it is, and for how long already. It appears after `delay` seconds (default 1), so a command
that fails at once prints its one error line and nothing else."""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Iterator

from tqdm.auto import tqdm


class Steps:
    """A bar over named steps; `next(name)` finishes the current step and names the next."""

    def __init__(self, bar: tqdm, shown: threading.Event) -> None:
        self._bar = bar
        self._shown = shown
        self.started = False

    def next(self, name: str) -> None:
        if self.started:
            self._bar.update(1)
        self.started = True
        # Drawn now only if the bar is already on screen; otherwise the ticker draws it after the delay.
        self._bar.set_postfix_str(name, refresh=self._shown.is_set())


@contextmanager
def steps(desc: str, total: int, tick_seconds: float | None = None, delay: float = 1.0) -> Iterator[Steps]:
    """A bar of `total` steps, shown after `delay` seconds and redrawn every `tick_seconds`
    (default: 1 s on a terminal, 30 s in a log file, where each redraw is a line) so that its
    elapsed time keeps moving during a long step."""
    if tick_seconds is None:
        tick_seconds = 1.0 if sys.stderr.isatty() else 30.0
    bar = tqdm(total=total, desc=desc, unit="step", delay=delay,
               bar_format="{desc}: {n_fmt}/{total_fmt} [{elapsed}] {postfix}")
    stop, shown = threading.Event(), threading.Event()

    def tick() -> None:
        if stop.wait(delay):
            return
        while True:
            bar.refresh()
            shown.set()
            if stop.wait(tick_seconds):
                return

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    tracker = Steps(bar, shown)
    try:
        yield tracker
        if tracker.started:
            bar.update(1)
    finally:
        stop.set()
        ticker.join()
        if shown.is_set():
            # tqdm counts only its own draws: after the ticker's, it must still end the bar's line
            # on close (else the next output, an error line, would continue it).
            bar.last_print_t = max(bar.last_print_t, bar.start_t + delay)
        bar.close()
