"""Lexical (BM25) scores of a library and their fusion with the retriever's cosine."""
import pytest
import torch

from hyfunc.cascade.lexical import LexicalIndex, fit_lexical_weight, sentences, tool_text
from hyfunc.cascade.retriever import RetrievalData, Retriever, RetrieverConfig, calibrate, example_scores
from hyfunc.formats.schema import parse_tools

TOOLS = parse_tools([
    {"name": "getWarehouseCapacity", "description": "Retrieve the current capacity of a warehouse",
     "parameters": {"type": "object", "properties": {"warehouse_id": {"type": "string", "description": "ID of the warehouse"}}}},
    {"name": "get_library_layout", "description": "Layout and design of a section of a library",
     "parameters": {"type": "object", "properties": {"floor": {"type": "integer", "description": "floor number"}}}},
    {"name": "detect.language", "description": "Detect the language of a text", "parameters": {"type": "object", "properties": {}}},
    {"name": "bookHotel", "description": "Book a hotel room", "parameters": {"type": "object", "properties": {}}},
])


def test_tool_text_splits_identifiers():
    text = tool_text(TOOLS[0])
    assert "get Warehouse Capacity" in text and "warehouse id" in text and "ID of the warehouse" in text
    assert tool_text(TOOLS[2]).startswith("detect language")


def test_sentences():
    assert sentences("Check the warehouse capacity. Then show the library layout! Thanks.") == [
        "Check the warehouse capacity.", "Then show the library layout!"]
    assert sentences("Hi.") == ["Hi."]  # nothing long enough: the whole request


def test_every_sentence_gets_its_best_tool():
    index = LexicalIndex(TOOLS)
    scores = index.scores("I need the capacity of warehouse 44. Then get the layout of the library's third floor.")
    assert scores.shape == (4,) and float(scores.min()) >= 0 and float(scores.max()) == 1.0
    # both tools asked for score 1 (each is the best of its sentence); the others score lower
    assert scores[0] == scores[1] == 1.0 and scores[2] < 1 and scores[3] < 1
    assert torch.equal(index.scores("zzz qqq"), torch.zeros(4))  # no word matches
    assert torch.equal(index.scores("What is it? Is it this one?"), torch.zeros(4))  # stopwords only
    assert index.batch_scores(["book a hotel", "zzz"]).shape == (2, 4)
    with pytest.raises(ValueError):
        LexicalIndex([])


def test_fusion_and_fitted_weight():
    # Cosine scores that rank a wrong tool first; the lexical scores know better.
    torch.manual_seed(0)
    model = Retriever(RetrieverConfig(query_dim=8, function_dim=8, proj_dim=8))
    queries, functions = torch.randn(6, 8), torch.randn(4, 8)
    cosine = example_scores(model, RetrievalData(queries, functions, [[0, 1, 2, 3]] * 6, [[0]] * 6))
    positives = [[int(torch.argsort(c)[0])] for c in cosine]  # the worst cosine is the gold tool
    lexical = [torch.tensor([1.0 if j == p[0] else 0.2 for j in range(4)]) for p in positives]
    data = RetrievalData(queries, functions, [[0, 1, 2, 3]] * 6, positives, lexical=lexical)
    result = fit_lexical_weight(model, data, k=1)
    assert result["recall@1 at weight 0"] == 0.0
    assert model.config.lexical_weight > 0 and result[f"recall@1 at weight {model.config.lexical_weight:g}"] == 1.0
    fused = example_scores(model, data)
    assert all(int(s.argmax()) == p[0] for s, p in zip(fused, positives))
    assert torch.allclose(model.scores(queries[0], functions, lexical[0]), fused[0])
    assert torch.allclose(model.scores(queries[0], functions), cosine[0])  # no lexical scores: cosine only
    # fused scores exceed 1: the calibrated rule still keeps exactly the gold tool
    calibrate(model, data)
    assert all(model.select_from_scores(s) == p for s, p in zip(fused, positives))
    with pytest.raises(ValueError, match="lexical"):
        RetrievalData(queries, functions, [[0, 1, 2, 3]] * 6, positives, lexical=lexical[:2])
    with pytest.raises(ValueError, match="lexical scores"):
        fit_lexical_weight(model, RetrievalData(queries, functions, [[0, 1, 2, 3]] * 6, positives))


def test_sentence_scores_one_row_per_sentence():
    index = LexicalIndex(TOOLS)
    request = "I need the capacity of warehouse 44. What is it? Then get the layout of the library's third floor."
    rows = index.sentence_scores(request)
    assert rows.shape == (len(sentences(request)), 4) == (3, 4)
    assert int(rows[0].argmax()) == 0 and int(rows[2].argmax()) == 1  # each sentence's own best tool
    assert torch.equal(rows[1], torch.zeros(4))  # stopwords only
    assert torch.equal(rows.max(0).values, index.scores(request))


def test_per_sentence_queries_score_each_tool_by_its_best_sentence():
    torch.manual_seed(0)
    model = Retriever(RetrieverConfig(query_dim=8, function_dim=8, proj_dim=8, lexical_weight=2.0, per_sentence=True))
    functions, sentence_queries = torch.randn(4, 8), [torch.randn(3, 8), torch.randn(1, 8)]
    lexical = [torch.rand(3, 4), torch.rand(1, 4)]
    cosine = model.scores(sentence_queries[0], functions)
    assert cosine.shape == (3, 4)
    for s in range(3):  # a row is that sentence's soft token scored alone
        assert torch.allclose(cosine[s], model.scores(sentence_queries[0][s], functions))
    fused = model.fuse(cosine, lexical[0])
    assert torch.allclose(fused, (cosine + 2.0 * lexical[0]).max(0).values)
    assert torch.allclose(model.scores(sentence_queries[0], functions, lexical[0]), fused)

    data = RetrievalData(torch.randn(2, 8), functions, [[0, 1, 2, 3]] * 2, [[1], [2]], lexical=lexical,
                         sentence_queries=sentence_queries)
    scores = example_scores(model, data)
    assert torch.allclose(scores[0], fused) and scores[1].shape == (4,)
    assert set(calibrate(model, data)) >= {"threshold", "refusal_threshold"}
    with pytest.raises(ValueError, match="each sentence"):
        RetrievalData(torch.randn(2, 8), functions, [[0, 1, 2, 3]] * 2, [[1], [2]], lexical=[torch.rand(4), torch.rand(4)],
                      sentence_queries=sentence_queries)
