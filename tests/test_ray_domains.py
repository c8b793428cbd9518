"""Recommendations, embeddings and summaries through the ray executor: the local engine's output.

A real local Ray is started once for the module and stopped after it. Each domain materialises one
generated day with executor local, then with executor ray in several shards on two workers, which
load the model themselves (once each); outputs are compared bit for bit, sorted by key.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest
from dagster import DagsterInstance, RunConfig, materialize
from documents_world import land_crafted_documents
from helpers import asset_metadata, cpu_inference

from assets.documents.assets import documents
from assets.embeddings.document_embeddings import document_embeddings
from assets.embeddings.schemas import EMBEDDINGS
from assets.recommendations import interactions, recommendation_model, user_recommendations
from assets.recommendations.assets import UserRecommendationsConfig
from assets.recommendations.demo_data import generate_day as generate_interactions
from assets.recommendations.schemas import INTERACTIONS, INTERACTIONS_SCHEMA, USER_RECOMMENDATIONS
from assets.recommendations.training import current_model, load_recommender
from assets.summaries.document_summaries import document_summaries
from assets.summaries.schemas import SUMMARIES
from inference.engine.device import make_runtime
from inference.engine.ray_pool import ray_session
from resources.inference import InferenceResource
from resources.storage import DataStore, StorageResource

TRAINING_DAYS = ["2026-03-01", "2026-03-02", "2026-03-03"]
DAY = "2026-03-04"
DOCS_DAY = "2026-03-02"
SCALE = 0.05  # 1,000 users x 250 items, about 2,000 events a day
SHARD_USERS = 150  # the day's audience in several shards of users
HELD = f"{USER_RECOMMENDATIONS}_quarantine"
# Crafted users: one who has seen the whole catalogue (quarantined, no_unseen_items; first in
# the audience, so every model call of the first shard is cut from other users than locally),
# one who has seen all but 5 items (short of k), one who only met an item the model does not
# know (ranked by popularity).
HEAVY_USER, NEARLY_ALL_USER, NEWCOMER = 0, 10**10, 10**10 + 1
UNKNOWN_ITEM = 10**12
DOCS_PER_SHARD = 4
# A text model's figures, the same whichever executor ran it.
TEXT_FIGURES = ("model_calls", "model_batch_tokens", "oom_backoffs", "rows_in", "rows_out")


@pytest.fixture(scope="module")
def ray():
    # A Ray of this module's own: without an address, ray.init joins whatever local Ray another
    # process on this machine has running (it finds it under /tmp/ray), and then refuses the
    # CPU and GPU counts; "local" always starts a new one.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_ADDRESS", "local")
        with ray_session("", num_cpus=2, num_gpus=0) as session:
            yield session


def _inference(**settings) -> InferenceResource:
    return cpu_inference(max_batch_size=64, **settings)


def _local_then_ray(assets: list, date: str, storage: StorageResource, read, run_config, **shards):
    """Materialises ``date`` with each executor, in the same shards (a shard is cut into model
    calls on its own, so the shard size decides which rows share a call, under both executors):
    ((local outputs, metadata), (ray's outputs, metadata))."""
    runs = []
    # Bit for bit needs the same intra-op threads on both sides: a matrix product split over
    # more threads may sum in another order (it did for MiniLM on a Xeon with AVX-512), so the
    # local engine runs on the one thread each actor has (ray_cpus_per_worker 1).
    for inference in (_inference(cpu_threads=1, **shards), _inference(executor="ray", **shards)):
        with DagsterInstance.ephemeral() as instance:
            result = materialize(
                assets,
                partition_key=date,
                resources={"storage": storage, "inference": inference},
                instance=instance,
                run_config=run_config,
            )
        assert result.success
        scored = assets[-1].key
        assert all(c.passed for c in result.get_asset_check_evaluations() if c.asset_key == scored)
        runs.append((read(), asset_metadata(result, scored)))
    return runs


def _sorted(store: DataStore, asset: str, date: str, *keys: str) -> pa.Table:
    return store.read_output(asset, date).sort_by([(k, "ascending") for k in keys]).combine_chunks()


# -- recommendations --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[DataStore, StorageResource]:
    root = tmp_path_factory.mktemp("ray-domains") / "data"
    store, storage = DataStore(str(root)), StorageResource(data_root=str(root))
    for day in [*TRAINING_DAYS, DAY]:
        generate_interactions(store, day, scale=SCALE)
    with DagsterInstance.ephemeral() as instance:
        trained = materialize(
            [interactions, recommendation_model],
            partition_key=TRAINING_DAYS[-1],
            resources={"storage": storage, "inference": _inference()},
            instance=instance,
        )
    assert trained.success
    model = load_recommender(store, current_model(store).version, make_runtime("cpu", "fp32"))
    items = model.items.ids
    users = [HEAVY_USER] * len(items) + [NEARLY_ALL_USER] * (len(items) - 5) + [NEWCOMER]
    seen = [*items, *items[5:], UNKNOWN_ITEM]
    noon = datetime.fromisoformat(DAY).replace(hour=12, tzinfo=UTC)
    crafted = pa.table(
        {
            "user_id": pa.array(users, pa.int64()),
            "item_id": pa.array(seen, pa.int64()),
            "ts": pa.array([noon] * len(users), pa.timestamp("us", tz="UTC")),
            "event": ["view"] * len(users),
            "weight": pa.array([1.0] * len(users), pa.float32()),
        },
        schema=INTERACTIONS_SCHEMA,
    )
    landed = store.read_landing(INTERACTIONS, DAY, INTERACTIONS_SCHEMA)
    store.write_landing(INTERACTIONS, DAY, pa.concat_tables([landed, crafted]))
    return store, storage


RANKING_FIGURES = (
    "users_short_of_k",
    "popularity_ranked_users",
    "model_users",
    "cold_start_users",
    "oom_backoffs",
    "audience_users",
    "rows_in",
    "rows_out",
    "rows_quarantined",
)


def test_recommendations_through_ray_equal_the_local_engine(world, ray) -> None:
    store, storage = world

    def read() -> dict[str, pa.Table]:
        return {
            USER_RECOMMENDATIONS: _sorted(store, USER_RECOMMENDATIONS, DAY, "user_id", "rank"),
            HELD: _sorted(store, HELD, DAY, "row_number"),
        }

    config = RunConfig({"user_recommendations": UserRecommendationsConfig(k=20)})
    (local, before), (distributed, after) = _local_then_ray(
        [interactions, user_recommendations], DAY, storage, read, config, shard_rows=SHARD_USERS
    )
    for asset, table in local.items():
        assert distributed[asset].equals(table), asset
    # The heavy user travelled without history, and is published as the local engine does.
    held = distributed[HELD]
    assert held.column_names == ["user_id", "row_number", "reason"]
    assert held["user_id"].to_pylist() == [HEAVY_USER]
    assert held["reason"].to_pylist() == ["no_unseen_items"]
    assert {k: after[k] for k in RANKING_FIGURES} == {k: before[k] for k in RANKING_FIGURES}
    # Counted by the workers and summed by the driver, not left at the driver's zeros.
    assert after["popularity_ranked_users"] > 0 and after["users_short_of_k"] > 0
    assert after["executor"] == "ray" and after["shard_layout"] == "user_ranges"
    assert after["user_shards"] == -(-after["audience_users"] // SHARD_USERS) > 2
    assert after["held_user_shards"] == 1
    assert after["shards"] == after["user_shards"] + 1
    assert after["workers"] == 2 and after["worker_model_loads"] == 2


# -- embeddings -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def documents_day(tmp_path_factory) -> tuple[DataStore, StorageResource]:
    root = tmp_path_factory.mktemp("ray-documents") / "data"
    store = DataStore(str(root))
    land_crafted_documents(store, DOCS_DAY)
    return store, StorageResource(data_root=str(root))


def test_embeddings_through_ray_equal_the_local_engine(documents_day, ray) -> None:
    store, storage = documents_day

    def read() -> dict[str, pa.Table]:
        return {
            EMBEDDINGS: _sorted(store, EMBEDDINGS, DOCS_DAY, "doc_id"),
            f"{EMBEDDINGS}_quarantine": _sorted(
                store, f"{EMBEDDINGS}_quarantine", DOCS_DAY, "row_number"
            ),
        }

    (local, before), (distributed, after) = _local_then_ray(
        [documents, document_embeddings], DOCS_DAY, storage, read, _documents_config(EMBEDDINGS)
    )
    # Bit for bit: each worker runs the model on the chunks the local engine runs it on (the
    # blank document is the last of its chunk, so setting it aside cuts no chunk differently).
    for asset, table in local.items():
        assert distributed[asset].equals(table), asset
    assert distributed[EMBEDDINGS].num_rows == 15
    assert distributed[f"{EMBEDDINGS}_quarantine"]["doc_id"].to_pylist() == ["blank"]
    assert {k: after[k] for k in TEXT_FIGURES} == {k: before[k] for k in TEXT_FIGURES}
    assert after["model_calls"] > 0 and after["rows_quarantined"] == 1
    assert after["executor"] == "ray" and after["shard_layout"] == "row_ranges"
    assert after["shards"] == 16 // DOCS_PER_SHARD
    assert after["workers"] == 2 and after["worker_model_loads"] == 2


def test_summaries_through_ray_equal_the_local_engine(documents_day, ray) -> None:
    store, storage = documents_day

    def read() -> pa.Table:
        return _sorted(store, SUMMARIES, DOCS_DAY, "doc_id")

    (local, before), (distributed, after) = _local_then_ray(
        [documents, document_summaries], DOCS_DAY, storage, read, _documents_config(SUMMARIES)
    )
    assert distributed.equals(local) and distributed.num_rows == 15
    assert {k: after[k] for k in TEXT_FIGURES} == {k: before[k] for k in TEXT_FIGURES}
    assert after["model_calls"] > 0 and after["rows_quarantined"] == 1
    assert after["shards"] == 16 // DOCS_PER_SHARD
    assert after["workers"] == 2 and after["worker_model_loads"] == 2


def _documents_config(asset: str) -> dict:
    """The crafted day's blank document is within the quarantine limit; small shards, chunks."""
    limit = {"max_quarantine_rate": 0.2}
    shards = {**limit, "docs_per_shard": DOCS_PER_SHARD, "docs_per_chunk": 2}
    return {"ops": {"documents": {"config": limit}, asset: {"config": shards}}}
