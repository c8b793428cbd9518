"""Summaries domain: sentence encoder, extractive summaries, topic clustering, demo data, assets."""

import shutil
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from dagster import Definitions, materialize
from documents_world import land_documents
from helpers import asset_metadata

from assets.day_metadata import day_entries
from assets.documents.assets import documents
from assets.documents.demo_data import generate_day
from assets.documents.schemas import DOCUMENTS_SCHEMA
from assets.summaries import defs
from assets.summaries.checks import digest_covers_every_document
from assets.summaries.digest import daily_digest
from assets.summaries.document_summaries import document_summaries
from inference.engine.adaptive import BatchTooLargeError
from inference.engine.device import make_runtime
from inference.generation.checkpoints import CheckpointError
from inference.text.embeddings import encode
from inference.text.encoder import load_sentence_encoder, packaged_encoder_path
from inference.text.segment import join_sentences, sentence_spans, split_sentences
from inference.text.text import ExtractiveSummary, extractive_summaries
from inference.text.topics import build_digest, choose_clusters, select_central

DAY = "2026-03-02"
NEXT_DAY = "2026-03-03"
RANGE_TAGS = {
    "dagster/asset_partition_range_start": DAY,
    "dagster/asset_partition_range_end": NEXT_DAY,
}
# The document and summary checks are declared on their assets (suites/*.json).
CHECKS = [digest_covers_every_document]


@pytest.fixture(scope="module")
def encoder():
    return load_sentence_encoder(make_runtime("cpu", "fp32"))


def failure_text(result) -> str:
    return "\n".join(
        e.event_specific_data.error.to_string() for e in result.get_step_failure_events()
    )


def test_definitions_hold_the_contracted_assets_and_checks(resources):
    assert {a.key.to_user_string() for a in defs.assets} == {
        "documents",
        "document_summaries",
        "daily_digest",
    }
    checks = {key.name for a in [*defs.assets, *defs.asset_checks] for key in a.check_keys}
    assert checks == {
        "document_ids_present_and_unique",
        "document_texts_usable",
        "documents_landed_on_time",
        "summaries_cover_every_document",
        "summaries_not_blank",
        "summaries_shorter_than_documents",
        "summaries_within_length_cap",
        "summaries_drawn_from_documents",
        "digest_covers_every_document",
    }
    Definitions.validate_loadable(Definitions.merge(defs, Definitions(resources=resources)))


def test_embeddings_are_unit_norm_and_closer_for_similar_sentences(encoder):
    texts = [
        "The cat sat on the mat.",
        "A kitten was resting on the rug.",
        "Stock markets fell sharply after the central bank raised rates.",
        "The cat sat on the mat.",
    ]
    out = encode(encoder, texts, max_batch_tokens=24, max_batch_size=8)
    vectors = out.vectors
    assert vectors.shape == (4, 384)
    assert torch.allclose(vectors.norm(dim=1), torch.ones(4), atol=1e-5)
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > similarity[0, 2] + 0.3
    assert torch.allclose(vectors[0], vectors[3])
    # A small token budget forces several length buckets; their results go back in input order.
    single = torch.cat([encode(encoder, [t], 64, 8).vectors for t in texts[:3]])
    assert out.model_calls >= 2
    assert torch.allclose(vectors[:3], single, atol=1e-5)


class SmallDevice(torch.nn.Module):
    """Runs an encoder like a device with room for ``capacity`` padded tokens per call: a
    bigger call raises the CUDA out-of-memory error, the type torch raises on a GPU."""

    def __init__(self, model: torch.nn.Module, capacity: int):
        super().__init__()
        self.model, self.config, self.capacity, self.calls = model, model.config, capacity, []

    def forward(self, input_ids, attention_mask):
        self.calls.append(input_ids.numel())
        if input_ids.numel() > self.capacity:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory ({input_ids.numel()} tokens)")
        return self.model(input_ids=input_ids, attention_mask=attention_mask)


def test_embeddings_back_off_on_out_of_memory_to_the_same_vectors(encoder):
    texts = [f"Sentence number {i} says {'something ' * (i % 7)}about the day." for i in range(40)]
    expected = encode(encoder, texts, max_batch_tokens=2048, max_batch_size=64).vectors
    device = SmallDevice(encoder.model, capacity=200)
    tight = replace(encoder, model=device)

    out = encode(tight, texts, max_batch_tokens=2048, max_batch_size=64)

    assert torch.allclose(out.vectors, expected, atol=1e-5)
    budget = tight.token_budget(2048)
    assert budget.ooms >= 2 and budget.size <= 200 and max(device.calls) > 200
    assert out.model_calls == len([c for c in device.calls if c <= 200])
    # The next call starts at the budget that fitted: no out-of-memory error at all.
    device.calls.clear()
    again = encode(tight, texts[:10], max_batch_tokens=2048, max_batch_size=64)
    assert max(device.calls) <= 200 and torch.allclose(again.vectors, expected[:10], atol=1e-5)
    # One text longer than the device holds is a clear error, not a retry loop.
    device.capacity = 5
    with pytest.raises(BatchTooLargeError, match="single item"):
        encode(tight, ["a text that is longer than five tokens, for sure"], 2048, 64)
    assert encoder.token_budget(2048).ooms == 0  # the fixture's own budget is untouched


def test_encoder_folder_with_pickled_weights_only_is_refused_with_how_to_convert(tmp_path):
    folder = tmp_path / "minilm"
    shutil.copytree(packaged_encoder_path(), folder, ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "pytorch_model.bin").write_bytes(b"never unpickled")
    with pytest.raises(CheckpointError) as refused:
        load_sentence_encoder(make_runtime("cpu", "fp32"), folder)
    message = str(refused.value)
    assert str(folder) in message and "pickled weights only (pytorch_model.bin)" in message
    assert "from transformers import AutoModel as M" in message
    with pytest.raises(CheckpointError, match="does not exist"):
        load_sentence_encoder(make_runtime("cpu", "fp32"), tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One. Two? Three!", ["One.", "Two?", "Three!"]),
        (
            "Dr. Shah met U.S. officials. They agreed.",
            ["Dr. Shah met U.S. officials.", "They agreed."],
        ),
        (
            "Rates rose 3.5% today. J. Smith said so.",
            ["Rates rose 3.5% today.", "J. Smith said so."],
        ),
        ("First paragraph\n\nSecond one.", ["First paragraph", "Second one."]),
        (
            'He said "yes." Then (briefly.) 2 left.',
            ['He said "yes."', "Then (briefly.)", "2 left."],
        ),
        ("", []),
        (None, []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_extractive_summaries_are_in_order_sentences_of_the_document(encoder, store):
    generate_day(store, DAY, scale=0.02, seed=3)
    bodies = store.read_landing("documents", DAY, DOCUMENTS_SCHEMA)["body"].to_pylist()
    summaries, embedded = extractive_summaries(
        encoder, bodies, max_sentences=3, max_batch_tokens=2048, max_batch_size=64
    )
    assert len(summaries) == len(bodies) == 10
    assert embedded.model_calls > 1
    for body, summary in zip(bodies, summaries, strict=True):
        sentences, picked = split_sentences(body), split_sentences(summary)
        assert 1 <= len(picked) <= 3
        positions = [sentences.index(s) for s in picked]
        assert positions == sorted(positions)
        assert len(summary) < len(body)


def test_empty_documents_and_days_give_empty_results(encoder):
    summaries, embedded = extractive_summaries(
        encoder,
        ["", None, "Only one sentence here."],
        max_sentences=3,
        max_batch_tokens=512,
        max_batch_size=8,
    )
    assert summaries == ["", "", "Only one sentence here."]
    assert embedded.model_calls == 1
    topics, _ = build_digest(encoder, [], [], max_batch_tokens=512, max_batch_size=8)
    assert topics == []


def test_select_central_skips_duplicates_and_prefers_central_rows():
    rows = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.3, 0.5], [0.0, 0.0, 1.0]])
    vectors = F.normalize(rows, dim=1)
    assert select_central(vectors, 2, centre=torch.tensor([1.0, 1.0, 0.0])) == [0, 2]
    # Once the duplicate is excluded, only three distinct rows remain to pick.
    assert sorted(select_central(vectors, 4)) in ([0, 2, 3], [1, 2, 3])


def test_choose_clusters_recovers_separated_groups():
    generator = torch.Generator().manual_seed(0)
    centres = torch.eye(8)[:3]
    points = torch.cat([c + 0.1 * torch.randn(20, 8, generator=generator) for c in centres])
    labels = choose_clusters(F.normalize(points, dim=1), k_max=6)
    assert len(set(labels.tolist())) == 3
    for group in range(3):
        assert len(set(labels[group * 20 : (group + 1) * 20].tolist())) == 1


def test_generate_day_is_deterministic(tmp_path: Path):
    from resources.storage import DataStore

    a, b, c = (DataStore(str(tmp_path / name)) for name in "abc")
    assert generate_day(a, DAY, scale=0.1, seed=7) == {"documents": 50}
    generate_day(b, DAY, scale=0.1, seed=7)
    generate_day(c, DAY, scale=0.1, seed=8)
    files = [Path(s.landing_files("documents", DAY)[0]).read_bytes() for s in (a, b, c)]
    assert files[0] == files[1]
    assert files[0] != files[2]
    table = pq.read_table(a.landing_files("documents", DAY)[0])
    assert table.schema.equals(DOCUMENTS_SCHEMA)
    assert table["doc_id"].to_pylist() == sorted(set(table["doc_id"].to_pylist()))
    lengths = [len(split_sentences(body)) for body in table["body"].to_pylist()]
    assert min(lengths) >= 5 and max(lengths) <= 40
    days = {t.date().isoformat() for t in table["published_at"].to_pylist()}
    assert days == {DAY}


def _per_day(result, asset: str, label: str) -> dict:
    """One metadata value of each day's materialisation of ``asset``, by partition."""
    return {
        e.partition: day_entries(e.step_materialization_data.materialization.metadata)[label].value
        for e in result.get_asset_materialization_events()
        if e.asset_key.to_user_string() == asset
    }


def test_pipeline_summarises_and_digests_a_range_in_one_run(store, resources, instance):
    for date in (DAY, NEXT_DAY):
        generate_day(store, date, scale=0.03)
    result = materialize(
        [documents, document_summaries, daily_digest, *CHECKS],
        resources=resources,
        instance=instance,
        tags=RANGE_TAGS,
    )
    assert result.success
    assert all(check.passed for check in result.get_asset_check_evaluations())
    metadata = {
        e.asset_key.to_user_string(): day_entries(
            e.step_materialization_data.materialization.metadata
        )
        for e in result.get_asset_materialization_events()
    }
    summary_meta = metadata["document_summaries"]
    assert summary_meta["partitions"].value == 2
    assert summary_meta["model_loads"].value == 1 and summary_meta["oom_backoffs"].value == 0
    assert summary_meta["model_batch_tokens"].value > 0
    # Each day is its own materialisation: its own rows, not the range's 30.
    per_day = _per_day(result, "document_summaries", "rows_out")
    assert per_day == {
        date: store.count_landing("documents", date, DOCUMENTS_SCHEMA) for date in (DAY, NEXT_DAY)
    }
    assert sum(per_day.values()) == 30
    assert summary_meta["model_version"].value.startswith("all-MiniLM-L6-v2@")
    # Each day's digest reads that day's summaries, at the snapshots their materialisation
    # handed on, and its check reads them there too.
    assert _per_day(result, "daily_digest", "rows_in") == per_day
    for date in (DAY, NEXT_DAY):
        handed = asset_metadata(result, "document_summaries", date)["table_snapshots"]
        assert handed["document_summaries"] > 0
        assert asset_metadata(result, "daily_digest", date)["read_snapshots"] == handed
    for date in (DAY, NEXT_DAY):
        docs = store.read_landing("documents", date, DOCUMENTS_SCHEMA).to_pylist()
        summaries = store.read_output("document_summaries", date).to_pylist()
        assert [s["doc_id"] for s in summaries] == [d["doc_id"] for d in docs]
        for doc, row in zip(docs, summaries, strict=True):
            assert set(split_sentences(row["summary"])) <= set(split_sentences(doc["body"]))
        digest = store.read_output("daily_digest", date)
        in_topics = [d for ids in digest["doc_ids"].to_pylist() for d in ids]
        assert sorted(in_topics) == sorted(d["doc_id"] for d in docs)
        assert digest["doc_count"].to_pylist() == [len(i) for i in digest["doc_ids"].to_pylist()]
        assert digest["topic_id"].to_pylist() == list(range(digest.num_rows))
        assert all(
            label and summary
            for label, summary in zip(
                digest["label"].to_pylist(), digest["summary"].to_pylist(), strict=True
            )
        )


def test_missing_landing_partition_fails_and_publishes_nothing(store, resources, instance):
    result = materialize(
        [documents], partition_key=DAY, resources=resources, instance=instance, raise_on_error=False
    )
    assert not result.success
    # A dagster Failure that forbids retries: a missing day will not appear on a retry.
    assert result.get_step_failure_events()[0].event_specific_data.error.cls_name == "Failure"
    message = failure_text(result)
    assert "'documents'" in message and DAY in message
    assert store.landing_path("documents", DAY) in message
    result = materialize(
        [document_summaries],
        partition_key=DAY,
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    assert "landing partition missing" in failure_text(result)
    assert not store.output_exists("document_summaries", DAY)


def test_wrong_column_type_fails_naming_file_and_column(store, resources, instance):
    bad = pa.table(
        {
            "doc_id": ["a"],
            "published_at": pa.array([0], pa.timestamp("us", tz="UTC")),
            "title": ["t"],
            "body": [42],
        }
    )
    path = store.write_landing("documents", DAY, bad)
    result = materialize(
        [documents], partition_key=DAY, resources=resources, instance=instance, raise_on_error=False
    )
    assert not result.success
    message = failure_text(result)
    assert path in message and "'body'" in message


# -- text a company lands: any script, markup, no punctuation; the hard length cap -----------

ODD_BODIES = {
    "html": "<html><head><script>track('<p>x</p>')</script><style>p{}</style></head><body>"
    "<h1>Port reopens</h1><p>The port reopened on Monday after a two-day strike &amp; "
    "talks.</p><p>Ships queued outside the harbour overnight. Unions said pay talks would "
    "continue next week.</p><p>The port handles a third of the country's imports.</p>"
    "</body></html>",
    "no_punctuation": " ".join(f"word{i % 97}" for i in range(2000)),
    "korean": "오늘 서울에서 큰 축제가 열렸다. 수천 명의 시민이 광장에 모였다. " * 20,
    "chinese": "今天上午，市政府宣布新的交通计划。地铁将延长运营时间。" * 30 + "市民表示欢迎。",
    "emoji": "🎉🔥👍🏽" * 400,
}


def test_odd_documents_get_bounded_summaries_and_labelled_topics(store, resources, instance):
    from inference.text.segment import LengthCap, within_cap

    land_documents(store, DAY, ODD_BODIES)
    result = materialize(
        [documents, document_summaries, daily_digest, *CHECKS],
        partition_key=DAY,
        resources=resources,
        instance=instance,
    )
    assert result.success
    assert all(check.passed for check in result.get_asset_check_evaluations())
    published = store.read_output("document_summaries", DAY).to_pylist()
    summaries = {r["doc_id"]: r["summary"] for r in published}
    cap = LengthCap()  # the asset's defaults: 3 sentences, 100 words or 300 characters
    for name, body in ODD_BODIES.items():
        summary = summaries[name]
        assert summary and within_cap(summary, cap), name
        assert len(summary) < len(body) / 2, name
    assert "<" not in summaries["html"] and "track" not in summaries["html"]
    assert "&amp;" not in summaries["html"]
    assert len(summaries["no_punctuation"].split()) <= 100
    assert len(summaries["chinese"]) <= 300 + 2 and summaries["chinese"].endswith("。")
    digest = store.read_output("daily_digest", DAY)
    assert all(label.strip() for label in digest["label"].to_pylist())


def test_a_summary_as_long_as_its_document_fails_the_blocking_cap(
    store, resources, instance, monkeypatch
):
    import importlib

    from inference.text.embeddings import Embeddings
    from inference.text.normalise import normalise_text

    # The summariser as it was: the "summary" of an article whose sentences it could not find
    # is the whole article, which is not longer than the document and is drawn from it (every
    # sentence recorded, and the summary their join).
    def whole_document(encoder, texts, **kwargs):
        summaries = []
        for text in texts:
            flat = normalise_text(text)
            spans = sentence_spans(flat)
            joined = join_sentences([flat[a:b] for a, b in spans])
            summaries.append(ExtractiveSummary(joined, spans))
        return summaries, Embeddings(torch.empty(0, 384), 0, 0.0)

    # The package re-exports the asset under the module's name: import the module itself.
    module = importlib.import_module("assets.summaries.document_summaries")
    monkeypatch.setattr(module, "extractive_summaries", whole_document)
    article = " ".join(f"word{i % 50}" for i in range(752)) + " end ."
    assert len(article.split()) == 754
    land_documents(store, DAY, {"article": article.lower(), "short": "One short sentence."})
    result = materialize(
        [documents, document_summaries, daily_digest],
        partition_key=DAY,
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    cap = checks["summaries_within_length_cap"]
    assert not cap.passed and cap.severity.value == "ERROR"
    assert cap.metadata["summary_over_length_cap"].value == 1
    limits = {"max_sentences": 3, "max_words": 100, "max_chars": 300}
    assert cap.metadata["length_cap"].value == limits
    # The old gate alone would have let it through.
    assert checks["summaries_shorter_than_documents"].passed
    assert checks["summaries_drawn_from_documents"].passed
    errors = [e.event_specific_data.error for e in result.get_step_failure_events()]
    assert [e.cls_name for e in errors] == ["DagsterAssetCheckFailedError"]
    assert "summaries_within_length_cap" in errors[0].to_string()
    assert not store.output_exists("daily_digest", DAY)


def test_the_length_cap_is_configurable(store, resources, instance):
    generate_day(store, DAY, scale=0.02, seed=5)
    config = {"max_sentences": 1, "max_words": 12, "ranking": "lead"}
    result = materialize(
        [documents, document_summaries],
        partition_key=DAY,
        resources=resources,
        instance=instance,
        run_config={"ops": {"document_summaries": {"config": config}}},
    )
    assert result.success
    for row in store.read_output("document_summaries", DAY).to_pylist():
        assert len(split_sentences(row["summary"])) == 1 and len(row["summary"].split()) <= 12


FORMS = ("tokenised", "plain")


def test_evaluation_samples_every_kth_article_and_tells_the_sources_apart(tmp_path):
    import hashlib

    from evaluation import summaries as evaluation

    cnn = "http://web.archive.org/web/2015id_/http://www.cnn.com/2015/03/01/world/story/index.html"
    mail = "http://web.archive.org/web/2015id_/http://www.dailymail.co.uk/news/article-1.html"
    urls = tmp_path / "urls.txt"
    urls.write_text(f"{cnn}\n{mail}\n")
    examples = [
        evaluation.Example(hashlib.sha1(cnn.encode()).hexdigest(), "No dateline here.", "x"),
        evaluation.Example(hashlib.sha1(mail.encode()).hexdigest(), "(CNN) -- misleading", "x"),
        evaluation.Example("not-listed-1", "By . Jo Bloggs . PUBLISHED: . 12:00 EST . Text.", "x"),
        evaluation.Example("not-listed-2", "LONDON, England (CNN) -- Text.", "x"),
        evaluation.Example("not-listed-3", "Plain text.", "x"),
    ]
    # The URL decides where there is one; the dateline only for articles it does not list.
    assert list(evaluation.article_sources(examples, urls).values()) == [
        "cnn", "dailymail", "dailymail", "cnn", "unknown",
    ]  # fmt: skip
    assert [e.doc_id for e in evaluation.every_kth(examples, 2, 1)] == [
        examples[1].doc_id, "not-listed-2",
    ]  # fmt: skip
    tune, report = evaluation.every_kth(range(100), 8, 0), evaluation.every_kth(range(100), 8, 4)
    assert not set(tune) & set(report) and len(tune) == 13 and len(report) == 12
    assert evaluation.report_offsets(20) == [5, 10, 15] and evaluation.report_offsets(1) == [0]
    with pytest.raises(ValueError, match="offset"):
        evaluation.every_kth(examples, 2, 2)


def test_evaluation_harness_runs_on_the_tiny_fixture_and_prints_the_table(
    encoder, tmp_path, capsys
):
    from evaluation import summaries as evaluation

    fixture = Path(__file__).parent / "fixtures" / "summaries_eval_tiny.csv"
    rows = evaluation.evaluate(fixture, every=1, offsets=[0], encoder=encoder, cache=tmp_path)
    # All four articles, and the same four as the group whose source nothing names.
    forms = [f"summaries_eval_tiny {g} ({f})" for g in ("all", "unknown") for f in FORMS]
    metrics = ("rouge1", "rouge2", "rougeLsum", "summary_words")
    assert {(r["dataset"], r["method"], r["metric"]) for r in rows} == {
        (f, method, m)
        for f in forms
        for method in ("nightshift", "nightshift ranking=lead", "lead-3")
        for m in metrics
    }
    for row in rows:
        assert row["documents"] == 4
        assert 0 <= row["value"] <= 100 if row["metric"] != "summary_words" else row["value"] > 0
    assert list(tmp_path.glob("embeddings-*.npz"))  # the second run reads them back
    argv = ["--data", str(fixture), "--every", "1", "--offset", "0", "--cache", str(tmp_path)]
    assert evaluation.main(argv) == 0
    printed = capsys.readouterr().out
    assert (
        "| dataset | method | rouge1 | rouge2 | rougeLsum | summary_words | documents |" in printed
    )
    assert printed.count("| summaries_eval_tiny ") == 12
    assert "No article of the sample is from: cnn, dailymail." in printed
    # The real set is not in the repository: without it the harness says how to get it.
    with pytest.raises(FileNotFoundError, match="git clone"):
        evaluation.dataset_path(cache=tmp_path)
    tokenised = evaluation.ptb_tokenise('He said "no." (CNN)The U.S. team won\'t go.')
    assert tokenised == "he said `` no . '' -lrb- cnn -rrb- the u.s. team wo n't go ."
