"""Embeddings domain: document_embeddings materialised over demo documents with the real MiniLM."""

import importlib
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import torch
from dagster import AssetKey, Definitions, asset, materialize
from documents_world import land_crafted_documents

from assets.day_metadata import day_entries
from assets.documents.assets import documents
from assets.documents.demo_data import generate_day
from assets.documents.schemas import DOCUMENTS_SCHEMA
from assets.embeddings import defs
from assets.embeddings.document_embeddings import (
    EmbeddingsConfig,
    document_chunking,
    document_embeddings,
    search_text,
)
from assets.text_models import sentence_encoder
from inference.text.embeddings import Embeddings, encode
from policy.partitions import daily_partitions

DAY = "2026-03-02"
NEXT_DAY = "2026-03-03"
RANGE_TAGS = {
    "dagster/asset_partition_range_start": DAY,
    "dagster/asset_partition_range_end": NEXT_DAY,
}
CHECKS = {
    "embeddings_cover_every_document",
    "embeddings_match_model_dimension",
    "embedding_values_finite",
    "embeddings_have_unit_norm",
    "embeddings_carry_model_version",
}


def _vectors(store, date: str) -> tuple[pa.Table, dict[str, np.ndarray]]:
    table = store.read_output("document_embeddings", date)
    matrix = np.stack(table["embedding"].to_numpy(zero_copy_only=False))
    return table, dict(zip(table["doc_id"].to_pylist(), matrix, strict=True))


def _embed(resources, instance, extra=(), **kwargs):
    config = {"config": {"max_quarantine_rate": 0.2}}
    return materialize(
        [documents, document_embeddings, *extra],
        resources=resources,
        instance=instance,
        run_config={"ops": {"documents": config, "document_embeddings": config}},
        **kwargs,
    )


def test_definitions_hold_the_asset_and_its_checks(resources):
    assert [a.key.to_user_string() for a in defs.assets] == ["document_embeddings"]
    assert {key.name for a in defs.assets for key in a.check_keys} == CHECKS
    Definitions.validate_loadable(Definitions.merge(defs, Definitions(resources=resources)))


def test_a_range_run_embeds_every_document_once_and_records_each_day(store, resources, instance):
    for date in (DAY, NEXT_DAY):
        generate_day(store, date, scale=0.03)
    result = materialize(
        [documents, document_embeddings], resources=resources, instance=instance, tags=RANGE_TAGS
    )
    assert result.success
    evaluations = result.get_asset_check_evaluations()
    assert all(check.passed for check in evaluations)
    # Each day its own check results...
    ours = [c for c in evaluations if c.asset_key == AssetKey("document_embeddings")]
    assert {(c.check_name, c.partition) for c in ours} == {
        (name, date) for name in CHECKS for date in (DAY, NEXT_DAY)
    }
    # ...and its own materialisation, with its own rows and throughput.
    days = {
        e.partition: day_entries(e.step_materialization_data.materialization.metadata)
        for e in result.get_asset_materialization_events()
        if e.asset_key.to_user_string() == "document_embeddings"
    }
    assert sorted(days) == [DAY, NEXT_DAY]
    for date, meta in days.items():
        docs = store.read_landing("documents", date, DOCUMENTS_SCHEMA)
        assert meta["rows_out"].value == meta["rows_in"].value == docs.num_rows
        assert meta["rows_per_second"].value > 0 and meta["model_calls"].value > 0
        assert meta["model_version"].value.startswith("all-MiniLM-L6-v2@")
        assert meta["partitions"].value == 2 and meta["model_loads"].value == 1
        table, vectors = _vectors(store, date)
        # The sentence vector's 384 dimensions, then the 1,024 hashed-word buckets.
        assert table.schema.field("embedding").type == pa.list_(pa.float32(), 384 + 1024)
        assert table["doc_id"].to_pylist() == docs["doc_id"].to_pylist()
        matrix = np.stack(list(vectors.values()))
        assert matrix.shape == (docs.num_rows, 384 + 1024) and matrix.dtype == np.float32
        assert np.allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-5)
        assert set(table["model_version"].to_pylist()) == {meta["model_version"].value}


def test_identical_texts_match_near_ones_are_closer_and_a_blank_one_is_quarantined(
    store, resources, instance
):
    landed = land_crafted_documents(store, DAY)
    result = _embed(resources, instance, partition_key=DAY)
    assert result.success
    checks = {
        (c.asset_key.to_user_string(), c.check_name): c
        for c in result.get_asset_check_evaluations()
    }
    assert all(c.passed for (key, _), c in checks.items() if key == "document_embeddings")
    # The blank document breaks the documents' contract as a WARN only: it is quarantined.
    usable = checks[("documents", "document_texts_usable")]
    assert not usable.passed and usable.severity.value == "WARN"
    table, vectors = _vectors(store, DAY)
    assert table["doc_id"].to_pylist() == [d for d in landed if d != "blank"]
    assert np.array_equal(vectors["same-1"], vectors["same-2"])
    assert vectors["cat"] @ vectors["kitten"] > vectors["cat"] @ vectors["rates"] + 0.2
    held = store.read_output("document_embeddings_quarantine", DAY)
    assert held["doc_id"].to_pylist() == ["blank"] and held["reason"].to_pylist() == ["empty_text"]
    [meta] = result.asset_materializations_for_node("document_embeddings")
    assert meta.metadata["quarantine_reasons"].value == {"empty_text": 1}


@asset(partitions_def=daily_partitions, deps=[document_embeddings])
def related_articles() -> None:
    """Stands in for whatever reads the embeddings downstream."""


def _double_the_first_vector(monkeypatch):
    """The embeddings step with a bug: the day's first vector comes out at twice unit norm.
    Returns the real step, to put back."""
    module = importlib.import_module("assets.embeddings.document_embeddings")
    real = module.embed_documents

    def one_vector_doubled(*args, **kwargs) -> Embeddings:
        embedded = real(*args, **kwargs)
        vectors = embedded.vectors.clone()
        vectors[0] *= 2
        return Embeddings(vectors, embedded.model_calls, embedded.padding)

    monkeypatch.setattr(module, "embed_documents", one_vector_doubled)
    return real


def test_a_vector_off_unit_norm_fails_the_blocking_check_and_stops_downstream(
    store, resources, instance, monkeypatch
):
    _double_the_first_vector(monkeypatch)
    land_crafted_documents(store, DAY)
    result = _embed(
        resources, instance, [related_articles], partition_key=DAY, raise_on_error=False
    )
    assert not result.success
    checks = {
        c.check_name: c
        for c in result.get_asset_check_evaluations()
        if c.asset_key == AssetKey("document_embeddings")
    }
    norm = checks.pop("embeddings_have_unit_norm")
    assert not norm.passed and norm.severity.value == "ERROR"
    assert norm.metadata["embedding_norm_off_unit"].value == 1
    assert abs(norm.metadata["embedding_norm_error_max"].value - 1.0) < 1e-5
    assert all(c.passed for c in checks.values()) and set(checks) == CHECKS - {norm.check_name}
    errors = [e.event_specific_data.error for e in result.get_step_failure_events()]
    assert [e.cls_name for e in errors] == ["DagsterAssetCheckFailedError"]
    assert "embeddings_have_unit_norm" in errors[0].to_string()
    assert not instance.get_materialized_partitions(AssetKey("related_articles"))


def test_a_day_its_blocking_check_refuses_is_never_published_and_a_rollback_restores(
    store, resources, instance, monkeypatch
):
    """Write-audit-publish: the checks read the staged snapshot; a refused day leaves main on
    the day before it, kept readable by its snapshot id; a rollback restores a day exactly."""
    land_crafted_documents(store, DAY)
    assert _embed(resources, instance, partition_key=DAY).success
    good = store.read_output("document_embeddings", DAY)
    good_commit = store.output_commit("document_embeddings", DAY)

    real = _double_the_first_vector(monkeypatch)
    refused = _embed(resources, instance, partition_key=DAY, raise_on_error=False)
    assert not refused.success
    # Main is where it was: the same commit, the same rows, to the bit.
    assert store.output_commit("document_embeddings", DAY) == good_commit
    assert store.read_output("document_embeddings", DAY).equals(good)
    (error,) = [e.event_specific_data.error for e in refused.get_step_failure_events()]
    message = error.to_string()
    history = store.tables.history("document_embeddings", DAY)
    (rejected,) = [day for day, where in history if where == "rejected"]
    assert f"branch rejected-{DAY}-{rejected.commit}" in message
    assert f"main keeps commit {good_commit}" in message
    kept = store.tables.read("document_embeddings", DAY, rejected.snapshot_id)
    norms = np.linalg.norm(np.stack(kept["embedding"].to_numpy(zero_copy_only=False)), axis=1)
    assert kept.num_rows == good.num_rows and abs(norms.max() - 2.0) < 1e-5

    monkeypatch.setattr(
        importlib.import_module("assets.embeddings.document_embeddings"), "embed_documents", real
    )
    store.publish("document_embeddings", DAY, [good.slice(0, 1)], good.schema)  # a bad hand
    assert store.read_output("document_embeddings", DAY).num_rows == 1
    restored = store.tables.rollback("document_embeddings", DAY, good_commit)
    assert restored.commit == good_commit
    assert store.read_output("document_embeddings", DAY).equals(good)
    wheres = [where for _, where in store.tables.history("document_embeddings", DAY)]
    assert wheres.count("current") == 1 and "rejected" in wheres


# A lead longer than the encoder's 256-token window, then tails that differ only beyond it.
LEAD = (
    "The city council approved a new budget for the harbour on Monday, after a long debate. "
    "Officials said repairs to the old pier would begin in the spring and last a year. "
) * 10
LONG = {
    "long-beaches": (
        "Harbour budget",
        LEAD + "The mayor praised volunteers who cleaned beaches. " * 6,
    ),
    "long-oil": (
        "Harbour budget",
        LEAD + "A court fined a shipper for dumping oil in the river. " * 6,
    ),
    "one-word": ("", "Storm."),
    # About 200 KB, under the documents' size limit: far more than the chunks kept.
    "huge": ("Archive", "The archive kept every council record since the war. " * 3800),
}


def test_long_documents_are_read_past_the_first_window_and_every_size_keeps_the_contract(
    store, resources, instance
):
    noon = int(datetime.fromisoformat(DAY).replace(tzinfo=UTC).timestamp() * 1e6) + 43_200_000_000
    table = pa.table(
        {
            "doc_id": list(LONG),
            "published_at": pa.array([noon] * len(LONG), pa.timestamp("us", tz="UTC")),
            "title": [title for title, _ in LONG.values()],
            "body": [body for _, body in LONG.values()],
        },
        schema=DOCUMENTS_SCHEMA,
    )
    store.write_landing("documents", DAY, table)
    result = _embed(resources, instance, partition_key=DAY)
    assert result.success and all(c.passed for c in result.get_asset_check_evaluations())
    published, vectors = _vectors(store, DAY)
    assert published["doc_id"].to_pylist() == list(LONG)
    matrix = np.stack(list(vectors.values()))
    assert matrix.shape == (len(LONG), 384 + 1024) and matrix.dtype == np.float32
    assert np.allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-5)
    # The version names the encoder and the default chunking: 2 chunks of the 256-token window.
    encoder = sentence_encoder(resources["inference"])
    chunking = document_chunking(encoder, EmbeddingsConfig())
    assert (chunking.window, chunking.max_chunks) == (256, 2)
    assert set(published["model_version"].to_pylist()) == {
        f"{encoder.version}/{chunking.describe()}"
    }
    # The encoder's first window alone cannot tell the two long documents apart; the asset can.
    texts = [search_text(*LONG[key]) for key in ("long-beaches", "long-oil")]
    first = encode(encoder, texts, max_batch_tokens=2048, max_batch_size=64).vectors
    assert torch.equal(first[0], first[1])
    assert float(vectors["long-beaches"] @ vectors["long-oil"]) < 0.999
