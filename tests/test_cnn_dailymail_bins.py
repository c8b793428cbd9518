"""The reader of See et al.'s chunked CNN/DailyMail files (evaluation.cnn_dailymail_bins)."""

from __future__ import annotations

import csv
import hashlib
import struct

import pytest

from evaluation import cnn_dailymail_bins as bins
from evaluation import summaries as evaluation


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _example(**features: str) -> bytes:
    """A tf.train.Example of bytes features, written as TensorFlow writes it."""
    entries = b"".join(
        _field(1, _field(1, k.encode()) + _field(2, _field(1, _field(1, v.encode()))))
        for k, v in features.items()
    )
    return _field(1, entries)


def _chunk(path, examples: list[bytes]) -> None:
    path.write_bytes(b"".join(struct.pack("q", len(e)) + e for e in examples))


def test_chunks_become_the_csv_the_evaluation_reads_with_ids_from_the_url_list(tmp_path):
    cnn = "http://web.archive.org/web/2015id_/http://www.cnn.com/2015/03/01/world/index.html"
    mail = "http://web.archive.org/web/2015id_/http://www.dailymail.co.uk/news/article-1.html"
    urls = tmp_path / "urls.txt"
    urls.write_text(f"{cnn}\n{mail}\n")
    article = "by . jo bloggs . published : . 12:00 est . the council approved it ."
    _chunk(
        tmp_path / "val_000.bin",
        [
            _example(article="london ( cnn ) it rained .", abstract="<s> it rained . </s>"),
            _example(abstract="<s> council approves . </s> <s> lane opens . </s>", article=article),
        ],
    )
    out = tmp_path / "chunks.csv"
    assert bins.main([str(out), str(urls), str(tmp_path / "val_000.bin")]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["id"] for r in rows] == [hashlib.sha1(u.encode()).hexdigest() for u in (cnn, mail)]
    assert rows[1]["highlights"] == "council approves .\nlane opens ."
    assert rows[1]["article"] == article
    examples = evaluation.load_examples(out)
    assert list(evaluation.article_sources(examples, urls).values()) == ["cnn", "dailymail"]
    # Without the URL list the tokenised datelines still tell them apart.
    assert list(evaluation.article_sources(examples, None).values()) == ["cnn", "dailymail"]
    # A pretokenised file has its own form only, scored as it is.
    assert evaluation.forms(examples[1], pretokenised=True) == {
        "tokenised": (article, "council approves .\nlane opens .")
    }


def test_a_truncated_chunk_or_an_empty_record_is_an_error_naming_the_file(tmp_path):
    urls = ["http://www.dailymail.co.uk/a.html"] * 3
    broken = tmp_path / "val_001.bin"
    record = _example(article="text .", abstract="<s> text . </s>")
    broken.write_bytes(struct.pack("q", len(record) + 5) + record)
    with pytest.raises(ValueError, match="val_001.bin: record at byte 0 runs past"):
        bins.read_chunk(broken)
    empty = tmp_path / "val_002.bin"
    _chunk(empty, [_example(article="", abstract="<s> x . </s>")])
    with pytest.raises(ValueError, match="val_002.bin: record 0 has no article"):
        bins.chunk_rows(empty, urls, 0)
    with pytest.raises(ValueError, match="exceed the URL list"):
        bins.chunk_rows(empty, urls, 3)


def test_the_tuning_criterion_ignores_a_source_with_too_few_articles():
    def rows(dataset: str, documents: int, values: dict[str, float]) -> list[dict]:
        return [
            {"dataset": dataset, "method": m, "metric": "rouge1", "value": v, "documents": n}
            for m, v in values.items()
            for n in [documents]
        ]

    sample = [
        *rows("d[0::80] all (tokenised)", 60, {"a": 40.0, "b": 41.0, "lead-3": 40.0}),
        *rows("d[0::80] dailymail (tokenised)", 52, {"a": 41.0, "b": 40.5, "lead-3": 40.0}),
        *rows("d[0::80] cnn (tokenised)", 8, {"a": 20.0, "b": 30.0, "lead-3": 25.0}),
        *rows("c[0::20] cnn (plain)", 50, {"a": 31.0, "b": 32.0, "lead-3": 30.0}),
    ]
    # The 8-article CNN group does not decide; the worst of the others does.
    assert evaluation._worst_margin(sample) == {"a": 1.0, "b": 0.5, "lead-3": 0.0}


def test_a_pretokenised_file_is_scored_in_that_form_only(tmp_path):
    from pathlib import Path

    from inference.engine.device import make_runtime
    from inference.text.encoder import load_sentence_encoder

    fixture = Path(__file__).parent / "fixtures" / "summaries_eval_tiny.csv"
    tokenised = tmp_path / "tiny_tokenised.csv"
    with tokenised.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, ["article", "highlights", "id"])
        writer.writeheader()
        for e in evaluation.load_examples(fixture):
            lines = "\n".join(evaluation.ptb_tokenise(h) for h in e.reference.splitlines())
            writer.writerow(
                {"article": evaluation.ptb_tokenise(e.article), "highlights": lines, "id": e.doc_id}
            )
    encoder = load_sentence_encoder(make_runtime("cpu", "fp32"))
    rows = evaluation.evaluate(
        tokenised, every=1, offsets=[0], encoder=encoder, cache=tmp_path, pretokenised=True
    )
    assert {r["dataset"] for r in rows} == {
        "tiny_tokenised all (tokenised)",
        "tiny_tokenised unknown (tokenised)",
    }
    plain = evaluation.evaluate(fixture, every=1, offsets=[0], encoder=encoder, cache=tmp_path)

    # The same articles, tokenised here or before: the same scores.
    def scores(rows):
        return {(r["dataset"].split(" ", 1)[1], r["method"], r["metric"]): r["value"] for r in rows}

    assert scores(rows).items() <= scores(plain).items()
