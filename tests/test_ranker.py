"""The trained sentence scorer: its features, its weights file, its training, and what it keeps."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from inference.engine.device import make_runtime
from inference.text.embeddings import encode
from inference.text.encoder import load_sentence_encoder
from inference.text.rank import RankerSettings, rank_sentences
from inference.text.ranker import (
    SHAPE_FEATURES,
    TrainedRanker,
    load_ranker,
    sentence_features,
    weights_metadata,
)
from inference.text.segment import LengthCap, split_sentences
from inference.text.text import summarise_sentences
from inference.text.train_ranker import Article, fit, fit_network, greedy_oracle

COLUMN = {name: i for i, name in enumerate(SHAPE_FEATURES)}


def _unit(n: int, width: int = 8, seed: int = 0) -> torch.Tensor:
    return F.normalize(torch.randn(n, width, generator=torch.Generator().manual_seed(seed)), dim=1)


def test_features_describe_place_shape_and_repeats():
    sentences = [
        "By . Daily Mail Reporter .",
        "The council approved the new bridge over the river on Tuesday night.",
        '"It will change the town," the mayor said of the 12 million pound plan.',
        "Will it open on time?",
        "The council approved the new bridge over the river on Tuesday night.",
    ]
    vectors = _unit(5)
    vectors[4] = vectors[1]
    x = sentence_features(sentences, vectors)
    assert x.shape == (5, len(SHAPE_FEATURES) + 8)
    assert torch.equal(x[:, len(SHAPE_FEATURES) :], vectors)
    assert x[:, COLUMN["byline"]].tolist() == [1, 0, 0, 0, 0]
    # Three words of text (the lone periods are not words): short.
    assert x[:, COLUMN["short"]].tolist() == [1, 0, 0, 1, 0]
    assert x[:, COLUMN["quote"]].tolist() == [0, 0, 1, 0, 0]
    assert x[:, COLUMN["question"]].tolist() == [0, 0, 0, 1, 0]
    assert x[:, COLUMN["digit"]].tolist() == [0, 0, 1, 0, 0]
    assert x[:, COLUMN["position_0"]].tolist() == [1, 0, 0, 0, 0]
    # The byline does not count as the lead: the first sentence of text is first in content.
    assert x[1, COLUMN["inverse_content_position"]] == 1.0
    assert x[4, COLUMN["most_similar_earlier"]] == pytest.approx(1.0)
    assert x[0, COLUMN["most_similar_earlier"]] == 0.0


def test_weights_round_trip_and_refuse_other_features(tmp_path):
    width = len(SHAPE_FEATURES) + 8
    ranker = TrainedRanker(torch.linspace(-1, 1, width), 0.5, torch.zeros(width), torch.ones(width))
    network = TrainedRanker(
        torch.linspace(-1, 1, 5),
        -0.25,
        torch.zeros(width),
        torch.ones(width),
        hidden=(torch.linspace(-0.5, 0.5, 5 * width).reshape(5, width), torch.zeros(5)),
    )
    x = sentence_features([f"Sentence {i} has a few words in it." for i in range(4)], _unit(4))
    for name, model in (("linear", ranker), ("network", network)):
        path = tmp_path / f"{name}.safetensors"
        model.save(path, {"data": "test"})
        assert torch.allclose(load_ranker(path).score(x), model.score(x), atol=1e-4), name
        assert weights_metadata(path)["provenance"] == {"data": "test"}
    path = tmp_path / "linear.safetensors"
    header = {k: json.dumps(v) for k, v in weights_metadata(path).items()}
    header["features"] = json.dumps(weights_metadata(path)["features"][:-1])
    stale = tmp_path / "stale.safetensors"
    save_file(load_file(path), stale, metadata=header)
    with pytest.raises(
        ValueError,
        match=r"stale\.safetensors.*retrain with python -m evaluation\.train_ranker",
    ):
        load_ranker(stale)


def test_packaged_weights_load_and_record_their_data():
    saved = weights_metadata()
    assert saved["provenance"]["trainer"] == "inference/text/train_ranker.py"
    assert "CNN/DailyMail" in saved["provenance"]["data"]
    packaged = load_ranker()
    assert len(packaged.mean) == len(SHAPE_FEATURES) + saved["embedding_width"]
    if packaged.hidden is not None:
        assert packaged.hidden[0].shape == (len(packaged.weights), len(packaged.mean))


def test_greedy_oracle_picks_the_sentences_the_highlights_say():
    sentences = [
        "The weather was mild on the coast.",
        "Police arrested two men after the bank robbery in Leeds.",
        "A spokesman declined to comment.",
        "The stolen cash was found in a car near the station.",
    ]
    reference = "Two men arrested after Leeds bank robbery .\nStolen cash found in a car ."
    assert greedy_oracle(sentences, reference) == [1, 3]
    # Nothing in common: nothing is picked.
    assert greedy_oracle(sentences, "Zebras graze quietly .") == []


def test_fit_learns_which_sentences_are_labelled():
    # One sentence per article carries a marker in its embedding and is the oracle's pick.
    docs = []
    for seed in range(40):
        vectors = _unit(6, seed=seed)
        chosen = seed % 6
        vectors[chosen, 0] += 3.0
        vectors = F.normalize(vectors, dim=1)
        sentences = [f"Sentence {i} of article {seed} has words." for i in range(6)]
        doc = Article("synthetic", "plain", "unknown", sentences, "")
        doc.vectors, doc.features = vectors, sentence_features(sentences, vectors)
        doc.oracle = (chosen,)
        docs.append(doc)
    for ranker in (fit(docs, l2=1e-3), fit_network(docs, units=16, decay=1e-4, epochs=300)):
        hits = [int(torch.argmax(ranker.score(d.features))) == d.oracle[0] for d in docs]
        assert sum(hits) >= 36, ranker.hidden is not None


@pytest.fixture(scope="module")
def encoder():
    return load_sentence_encoder(make_runtime("cpu", "fp32"))


def test_trained_ranking_skips_the_byline_and_a_repeated_lead(encoder):
    article = (
        "By . Daily Mail Reporter . PUBLISHED: . 12:01 EST, 3 March 2015 . "
        "Two men have been arrested after a bank in the centre of Leeds was robbed at gunpoint "
        "on Monday morning. Police said the men, aged 24 and 31, were held at a house in "
        "Bradford after a search lasting six hours. Staff at the branch were unhurt but shaken, "
        "a spokesman for the bank said. Two men have been arrested after a bank in the centre "
        "of Leeds was robbed. Officers recovered a large sum of cash from a car parked near "
        "the railway station. The men are due to appear before magistrates on Wednesday."
    )
    sentences = split_sentences(article)
    vectors = encode(encoder, sentences, 2048, 64).vectors
    order = rank_sentences(vectors, sentences, RankerSettings())
    # The byline's pieces come after every sentence that says something, then the repeat.
    assert sentences[:4] == [
        "By .",
        "Daily Mail Reporter .",
        "PUBLISHED: .",
        "12:01 EST, 3 March 2015 .",
    ]
    assert set(order[-5:-1]) == {0, 1, 2, 3}
    assert sorted(order) == list(range(len(sentences)))
    lead, repeat = (i for i, s in enumerate(sentences) if s.startswith("Two men"))
    summary = summarise_sentences(sentences, vectors, LengthCap(3, 100, 300), RankerSettings())
    assert "Daily Mail Reporter" not in summary and "PUBLISHED" not in summary
    assert sentences[lead] in summary
    # The near copy of the lead shares its trigrams: it goes after the sentences that do not.
    assert sentences[repeat] not in summary
    assert order.index(repeat) > order.index(lead) and order[-1] == repeat
