"""Batching across requests: the step batcher merges concurrent requests' steps, the worker runs a
group of requests together and everything else alone and in order, and llama.cpp's batched steps
(one llama_decode, a sequence per request) give what each request gets alone."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from hyfunc.models.step_batcher import StepBatcher, request_thread
from hyfunc.serving.worker import ModelWorker


def _requests(batcher: StepBatcher, n: int, steps: int) -> None:
    """`n` request threads, registered, each submitting `steps` steps (request, step) in order."""
    ready = threading.Barrier(n)

    def request(i: int) -> None:
        with request_thread():
            ready.wait()
            for step in range(steps):
                batcher.submit((i, step))

    threads = [threading.Thread(target=request, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)


def test_the_steps_of_running_requests_share_one_call_each_round() -> None:
    calls: list[list] = []
    batcher = StepBatcher(lambda group: calls.append(list(group)), lambda group, piece: True, window=5.0)
    _requests(batcher, 3, 4)
    assert [len(call) for call in calls] == [3, 3, 3, 3]  # every round: one call for the three requests
    for i in range(3):  # each request's steps ran in its order
        assert [step for call in calls for (r, step) in call if r == i] == [0, 1, 2, 3]


def test_a_group_holds_only_what_fits() -> None:
    calls: list[list] = []
    batcher = StepBatcher(lambda group: calls.append(list(group)), lambda group, piece: len(group) < 2, window=5.0)
    _requests(batcher, 3, 2)
    # the step left out waits for the next call, beside the next round's first step
    assert [len(call) for call in calls] == [2, 2, 2] and {p for call in calls for p in call} == {(i, s) for i in range(3) for s in range(2)}


def test_a_lone_request_does_not_wait_for_the_window() -> None:
    batcher = StepBatcher(lambda group: None, lambda group, piece: True, window=30.0)
    start = time.monotonic()
    _requests(batcher, 1, 3)
    assert time.monotonic() - start < 10  # three windows would be 90 s


def test_an_engine_error_reaches_every_step_of_its_call() -> None:
    def fail(group: list) -> None:
        raise RuntimeError("no KV slot")

    batcher = StepBatcher(fail, lambda group, piece: True)
    with pytest.raises(RuntimeError, match="no KV slot"):
        batcher.submit("a step")
    with pytest.raises(RuntimeError, match="no KV slot"):  # and the next call is tried anew
        batcher.submit("another")


def test_serve_takes_a_batch_of_1_to_4(capsys: pytest.CaptureFixture[str]) -> None:
    from hyfunc.cli.parsers import build_parser

    assert build_parser().parse_args(["serve", "--batch", "4"]).batch == 4
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--batch", "5"])
    assert "not between 1 and 4" in capsys.readouterr().err


def test_the_worker_runs_a_group_together_and_everything_else_alone_in_order() -> None:
    worker = ModelWorker(max_queue=8, batch=2)
    events: list[str] = []
    lock = threading.Lock()
    release = threading.Event()

    def job(name: str, hold: bool = False):
        def fn(_job) -> None:
            with lock:
                events.append(f"start {name}")
            if hold:
                release.wait(30)
            with lock:
                events.append(f"end {name}")
        return fn

    a = worker.submit(job("a", hold=True), 60, group="library-1")
    b = worker.submit(job("b", hold=True), 60, group="library-1")
    alone = worker.submit(job("alone"), 60)  # no group: waits for a and b
    c = worker.submit(job("c"), 60, group="library-1")  # same group as a, b: still not before `alone`
    deadline = time.monotonic() + 30
    while events.count("start a") + events.count("start b") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(events) == ["start a", "start b"]  # together: both started, neither finished
    release.set()
    for j in (a, b, alone, c):
        j.future.result(timeout=30)
    assert events.index("start alone") > max(events.index("end a"), events.index("end b"))
    assert events.index("start c") > events.index("end alone")
    worker.shutdown()


@pytest.mark.integration
def test_batched_llamacpp_steps_equal_each_request_alone() -> None:
    """Teacher-forced with each request's own greedy tokens: batched, the logits are those of the
    request alone up to the kernels' rounding (llama.cpp's matrix kernels differ by batch size: a
    near tie can flip, as between any two batch shapes; `test_engines` allows the same)."""
    from hyfunc.models.llamacpp import LlamaCppBackend, llama_cpp_available

    if not llama_cpp_available():
        pytest.skip("llama-cpp-python is not installed (make llamacpp)")
    backend = LlamaCppBackend("smollm2-135m", n_ctx=2048, n_seq=8)
    prompts = [backend.encode(backend.chat_prompt([{"role": "user", "content": text}]))
               for text in ("What is the weather like in Paris today?", "Book a table for two at eight, please.")]

    def run(ids: list[int], forced: list[int] | None, out: list) -> None:
        """Prefill, then 8 steps: greedy (forced None, the tokens are appended to out[0]) or forced."""
        step = backend.forward(ids=ids)
        tokens: list[int] = []
        for i in range(8):
            out.append(step.logits.clone())
            tokens.append(int(torch.argmax(step.logits)) if forced is None else forced[i])
            step = backend.forward(ids=[tokens[-1]], cache=step.cache)
        out.insert(0, tokens)

    alone = [[] for _ in prompts]
    for ids, out in zip(prompts, alone):
        run(ids, None, out)
    sizes: list[int] = []
    backend.enable_batching(on_run=sizes.append)
    together = [[] for _ in prompts]
    ready = threading.Barrier(len(prompts))

    def request(ids: list[int], forced: list[int], out: list) -> None:
        with request_thread():
            ready.wait()
            run(ids, forced, out)

    threads = [threading.Thread(target=request, args=(ids, first[0], out)) for ids, first, out in zip(prompts, alone, together)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert max(sizes) == 2 and sizes.count(2) >= 8  # the two requests' steps ran in shared llama_decode calls
    for mine, theirs in zip(together, alone):
        cosines = torch.nn.functional.cosine_similarity(torch.stack(mine[1:]), torch.stack(theirs[1:]), dim=-1)
        assert len(cosines) == 8 and cosines.min() > 0.99


@pytest.mark.integration
def test_a_batched_server_answers_concurrent_requests_in_shared_steps() -> None:
    """`hyfunc serve --batch 2`'s code path (a real uvicorn process, the cascade on llama.cpp): concurrent
    requests over the same library all get their calls, and their steps shared engine calls."""
    import httpx
    import openai

    from hyfunc.models.llamacpp import llama_cpp_available
    from tests.serve_process import running_server
    from tests.test_serve_sdk import TOOLS

    if not llama_cpp_available():
        pytest.skip("llama-cpp-python is not installed (make llamacpp)")
    with running_server({"method": "cascade", "engine": "llamacpp", "batch": 2}) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)

        def ask(city: str) -> list:
            reply = client.chat.completions.create(model="hyfunc", tools=TOOLS, messages=[
                {"role": "user", "content": f"What's the weather in {city}?"}])
            return reply.choices[0].message.tool_calls or []

        assert ask("Lisbon")  # the library is built by this first request, alone
        results: list[list] = []
        threads = [threading.Thread(target=lambda c=city: results.append(ask(c))) for city in ("Oslo", "Rome", "Paris", "Bern")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        metrics = httpx.get(f"{url}/metrics").text
    names = {t["function"]["name"] for t in TOOLS}
    assert len(results) == 4 and all(calls and {c.function.name for c in calls} <= names for calls in results)
    shared = [line for line in metrics.splitlines() if line.startswith("hyfunc:engine_steps_total") and 'sequences="2"' in line]
    assert shared and all(float(line.rsplit(" ", 1)[1]) >= 1 for line in shared)
