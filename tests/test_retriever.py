import math

import pytest
import torch

from hyfunc.cascade.retriever import (
    RetrievalData,
    Retriever,
    RetrieverConfig,
    calibrate,
    evaluate,
    exact_set_accuracy,
    info_nce_loss,
    new_retriever,
    recall_at_k,
    refusal_accuracy,
    select_indices,
    train_retriever,
)

QD, FD, LATENT, N_TOOLS = 24, 32, 8, 40


def toy_data(n: int, seed: int, refuse_every: int = 5, pair_every: int = 3) -> RetrievalData:
    """Clustered toy set: each tool is a latent point; queries and function embeddings see it
    through two different random linear maps (so matching needs learning), plus noise. Every
    `refuse_every`-th example asks for a latent point that no tool has: it must be refused; every
    `pair_every`-th calls two tools (0: none does)."""
    world = torch.Generator().manual_seed(0)  # the tools and maps are shared by all splits
    latents = torch.randn(N_TOOLS, LATENT, generator=world)
    to_q, to_f = torch.randn(LATENT, QD, generator=world), torch.randn(LATENT, FD, generator=world)
    g = torch.Generator().manual_seed(seed)
    queries, functions, candidates, positives, keys = [], [], [], [], []
    for i in range(n):
        tools = torch.randperm(N_TOOLS, generator=g)[:5].tolist()
        refuse = i % refuse_every == 0
        gold = [] if refuse else tools[: 1 + bool(pair_every and i % pair_every == 0)]
        latent = torch.randn(LATENT, generator=g) if refuse else latents[gold].mean(0)
        queries.append(latent @ to_q + 0.1 * torch.randn(QD, generator=g))
        rows = list(range(len(functions), len(functions) + len(tools)))
        for t in tools:  # per-example noise: a tool's embedding depends on its prompt context
            functions.append(latents[t] @ to_f + 0.1 * torch.randn(FD, generator=g))
            keys.append(f"tool{t}")
        candidates.append(rows)
        positives.append([rows[tools.index(t)] for t in gold])
    return RetrievalData(torch.stack(queries), torch.stack(functions), candidates, positives, keys)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Toy-sized matmuls: extra threads only add synchronisation (10x slower on a busy 2-core box).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def trained(one_thread):
    model = Retriever(RetrieverConfig(query_dim=QD, function_dim=FD, proj_dim=16, mlp_hidden=32))
    history = train_retriever(model, toy_data(300, seed=1), epochs=30, batch_size=16, lr=3e-3, seed=0)
    result = calibrate(model, toy_data(100, seed=2))
    return model, history, result


def test_training_reduces_loss(trained):
    _, history, _ = trained
    assert len(history) == 30 and all(math.isfinite(h) for h in history)
    assert history[-1] < 0.5 * history[0]


def test_recall_and_refusal_after_training(trained):
    model, _, result = trained
    metrics = evaluate(model, toy_data(200, seed=3))
    assert metrics["recall@3"] > 0.95
    assert evaluate(model, toy_data(200, seed=3, pair_every=0))["recall@1"] > 0.9  # one gold call each
    assert metrics["exact_set_accuracy"] > 0.7  # set size by one threshold is the hard part; ranking is not
    assert metrics["refusal_accuracy"] > 0.8
    assert model.config.refusal_threshold == result["refusal_threshold"] > -1.0
    assert result["exact_set_accuracy"] > 0.7


def test_select_rule():
    assert select_indices([0.1, 0.2], threshold=0.5, refusal_threshold=0.3, top_k=8) == []  # below refusal
    assert select_indices([0.6, 0.9, 0.2], threshold=0.5, refusal_threshold=0.3, top_k=8) == [1, 0]
    assert select_indices([0.45, 0.4], threshold=0.5, refusal_threshold=0.3, top_k=8) == [0]  # at least the best
    assert select_indices([0.9, 0.8, 0.7], threshold=0.5, refusal_threshold=0.3, top_k=2) == [0, 1]  # cap
    assert select_indices([], threshold=0.5, refusal_threshold=-1.0, top_k=2) == []
    # given an answerability (best cosine without the lexical part, or the refusal head's logit), refusal looks at it alone
    assert select_indices([1.6, 0.9], threshold=0.5, refusal_threshold=0.3, top_k=8, answerability=0.2) == []
    assert select_indices([1.6, 0.9], threshold=1.0, refusal_threshold=0.3, top_k=8, answerability=0.4) == [0]


def test_below_threshold_query_is_refused(trained):
    model, _, _ = trained
    data = toy_data(50, seed=4)
    for i in range(len(data)):
        q, f = data.queries[i], data.functions[data.candidates[i]]
        best = float(model.scores(q, f).max())
        if best < model.config.refusal_threshold:
            assert model.select(q, f) == []
        else:
            assert 1 <= len(model.select(q, f)) <= model.config.top_k


def test_save_load_round_trip(trained, tmp_path):
    model, _, _ = trained
    data = toy_data(20, seed=5)
    model.save(tmp_path / "r", meta={"encoder": "tiny", "mode": "joint"})
    loaded = Retriever.load(tmp_path / "r")
    assert loaded.config == model.config and loaded.meta == {"encoder": "tiny", "mode": "joint"}
    for i in range(len(data)):
        q, f = data.queries[i], data.functions[data.candidates[i]]
        assert torch.equal(model.scores(q, f), loaded.scores(q, f))
        assert model.select(q, f) == loaded.select(q, f)
    with pytest.raises(FileNotFoundError):
        Retriever.load(tmp_path / "missing")


def test_other_gold_tools_are_not_negatives():
    # Two copies of the gold tool (same key) in one batch: the loss must not push them apart,
    # so it is the same as when the second copy is absent.
    q = torch.randn(2, QD)
    f = torch.randn(4, FD)
    model = Retriever(RetrieverConfig(query_dim=QD, function_dim=FD, proj_dim=8))
    same = RetrievalData(q, f, [[0, 1], [2, 3]], [[0], [2]], keys=["a", "b", "a", "c"])
    loss = info_nce_loss(model, same, [0, 1])
    f2 = f.clone()
    f2[2] = torch.randn(FD) * 100  # moving the masked copy changes nothing for example 0
    moved = info_nce_loss(model, RetrievalData(q, f2, same.candidates, same.positives, same.keys), [0])
    assert torch.isfinite(loss)
    assert torch.allclose(moved, info_nce_loss(model, same, [0]))
    assert info_nce_loss(model, RetrievalData(q, f, [[0, 1], [2, 3]], [[], []]), [0, 1]) is None


def test_metrics():
    assert recall_at_k([[0, 1, 2], [2, 1, 0]], [[0], [0, 1]], 1) == pytest.approx(0.5)
    assert recall_at_k([[0, 1, 2], [2, 1, 0]], [[0], [0, 1]], 3) == 1.0
    assert exact_set_accuracy([[0], [], [1, 0]], [[0], [], [0, 1]]) == 1.0
    assert exact_set_accuracy([[0], [1]], [[0], []]) == 0.5
    assert refusal_accuracy([[0], [], [1]], [[0], [], []]) == 0.5
    assert math.isnan(refusal_accuracy([[0]], [[0]]))


def separable_refusals(n: int, seed: int) -> RetrievalData:
    """The toy set with its no-call requests moved along one direction of the query space: what a
    linear refusal head can learn (the toy set's own refusals are random points, not separable)."""
    data = toy_data(n, seed)
    shift = torch.zeros(QD)
    shift[0] = 4.0
    queries = data.queries.clone()
    for i, pos in enumerate(data.positives):
        if not pos:
            queries[i] += shift
    return RetrievalData(queries, data.functions, data.candidates, data.positives, data.keys)


def test_refusal_head_learns_to_refuse_and_the_rule_follows_it():
    model = Retriever(RetrieverConfig(query_dim=QD, function_dim=FD, proj_dim=16, mlp_hidden=32, refusal_head=True))
    train_retriever(model, separable_refusals(300, seed=1), epochs=10, batch_size=16, lr=3e-3, seed=0)
    result = calibrate(model, separable_refusals(100, seed=2))
    metrics = evaluate(model, separable_refusals(200, seed=3))
    assert result["refusal_balanced_accuracy"] > 0.95
    assert metrics["refusal_accuracy"] > 0.9
    # ... and the call examples are answered: exact-set accuracy would collapse if they were refused
    assert metrics["exact_set_accuracy"] > 0.7
    test = separable_refusals(20, seed=4)
    for i in range(len(test)):
        q, f = test.queries[i], test.functions[test.candidates[i]]
        logit = float(model.answerability(q, [model.scores(q, f)]))
        assert (model.select(q, f) == []) == (logit < model.config.refusal_threshold)


def test_refusal_head_needs_both_kinds_of_example():
    model = Retriever(RetrieverConfig(query_dim=QD, function_dim=FD, proj_dim=8, refusal_head=True))
    data = toy_data(30, seed=1)
    with pytest.raises(ValueError, match="both with and without a call"):
        train_retriever(model, data.subset([i for i, pos in enumerate(data.positives) if pos]), epochs=1)


def test_refusal_head_survives_save_and_load(tmp_path):
    model = Retriever(RetrieverConfig(query_dim=QD, function_dim=FD, proj_dim=8, refusal_head=True))
    train_retriever(model, separable_refusals(60, seed=1), epochs=2)
    model.save(tmp_path / "r")
    loaded = Retriever.load(tmp_path / "r")
    q = separable_refusals(10, seed=5).queries
    assert loaded.refusal is not None and torch.equal(model.answerability(q, []), loaded.answerability(q, []))


def test_new_retriever_does_not_depend_on_earlier_random_draws():
    first, _ = new_retriever(QD, {"proj_dim": 8}, seed=3)
    torch.rand(1000)  # anything else drawing from the global generator in between
    second, _ = new_retriever(QD, {"proj_dim": 8}, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
