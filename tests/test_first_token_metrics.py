"""Time to first token of generation days: per request from the generation call, merged
exactly over shards in bucket counts, in the day's metadata and in the pushed Prometheus
histogram named after the OpenTelemetry GenAI convention."""

from __future__ import annotations

import bisect
import time

import pytest
from dagster import materialize
from helpers import asset_metadata, cpu_resources
from prometheus_client.utils import floatToGoString
from test_generate import DOCS, LIMITS, checkpoints  # noqa: F401 - the tiny checkpoints fixture
from test_run_metrics import _samples, _value, gateway  # noqa: F401 - the recording Pushgateway

from assets.documents.assets import documents
from assets.documents.demo_data import generate_day
from assets.summaries.document_summaries import document_summaries
from inference.engine.device import make_runtime
from inference.engine.metrics import FIRST_TOKEN_BUCKETS, BatchMetrics
from inference.engine.observer import ShardSeen
from inference.generation.generate import generate_summaries, load_generator
from resources.run_metrics import FIRST_TOKEN, METRIC_NAMES, MetricsSettings, RunMetrics

DAY, OTHER_DAY = "2026-03-02", "2026-03-03"


def test_merging_two_batch_metrics_adds_their_first_token_buckets_exactly() -> None:
    first, second = [0.0004, 0.3, 4000.0, 0.25], [0.25, 0.3, 1.5, 12.0, 0.001]
    a, b, together = BatchMetrics(), BatchMetrics(), BatchMetrics()
    a.record_first_tokens(first)
    b.record_first_tokens(second)
    together.record_first_tokens(first + second)
    a.merge(b)
    assert a.first_token_counts == together.first_token_counts
    assert a.first_tokens == len(first) + len(second)
    assert a.first_token_sum == pytest.approx(sum(first + second))
    assert a.first_token_max == max(first + second)
    # Prometheus's buckets are upper bounds a value may equal; past the last one is +Inf.
    expected = [0] * (len(FIRST_TOKEN_BUCKETS) + 1)
    for value in first + second:
        expected[bisect.bisect_left(FIRST_TOKEN_BUCKETS, value)] += 1
    assert a.first_token_counts == expected
    percentiles = a.first_token_percentiles()
    assert 0 < percentiles["ttft_p50_s"] <= percentiles["ttft_p95_s"] <= a.first_token_max
    assert BatchMetrics().first_token_percentiles() == {}


@pytest.mark.parametrize("kind", ["seq2seq", "causal"])
def test_every_generated_text_has_a_first_token_time_within_its_call(checkpoints, kind):  # noqa: F811
    generator = load_generator(checkpoints[kind], make_runtime("cpu", "fp32"))
    # Several length buckets, so later requests wait for the batches run before theirs.
    limits = LIMITS | {"max_batch_size": 3}
    started = time.perf_counter()
    out = generate_summaries(generator, DOCS, **limits)
    call = time.perf_counter() - started
    assert len(out.batch_sizes) > 1
    assert len(out.first_token_seconds) == len(DOCS)
    assert all(0 < t <= call for t in out.first_token_seconds)
    assert len(set(out.first_token_seconds)) > 1  # a batch's requests share its first step


def abstractive_day(day: str, data_root, instance, checkpoint, max_new_tokens: int, recorder):
    """An abstractive summaries day in several shards of several model calls (their figures
    are merged on the driver), pushing its metrics to the recording Pushgateway ``recorder``."""
    config = {
        "mode": "abstractive",
        "checkpoint_path": str(checkpoint),
        "max_new_tokens": max_new_tokens,
        "docs_per_chunk": 4,
        "docs_per_shard": 8,
    }
    url = f"http://127.0.0.1:{recorder.server_address[1]}"
    return materialize(
        [documents, document_summaries],
        partition_key=day,
        resources=cpu_resources(data_root, metrics_pushgateway=url, metrics_push_seconds=0.01),
        instance=instance,
        run_config={"ops": {"document_summaries": {"config": config}}},
    )


def test_a_generation_day_pushes_its_first_token_histogram_and_records_its_percentiles(
    checkpoints,  # noqa: F811
    gateway,  # noqa: F811
    store,
    data_root,
    instance,
) -> None:
    generate_day(store, DAY, scale=0.05)
    result = abstractive_day(DAY, data_root, instance, checkpoints["seq2seq"], 4, gateway)
    assert result.success
    meta = asset_metadata(result, "document_summaries")
    rows = store.read_output("document_summaries", DAY).num_rows
    assert rows == meta["rows_out"] > 8
    assert meta["batch_count"] > 2
    assert 0 < meta["ttft_p50_s"] <= meta["ttft_p95_s"] <= meta["compute_seconds"]

    assert FIRST_TOKEN in METRIC_NAMES
    final = _samples(gateway.requests[-1][2])  # type: ignore[attr-defined]
    day = {"asset": "document_summaries", "partition": DAY}
    assert _value(final, f"{FIRST_TOKEN}_count", **day) == rows
    assert _value(final, f"{FIRST_TOKEN}_sum", **day) > 0
    # Every request's time is within the day's model-call seconds: all are counted in the
    # first bucket whose bound reaches them.
    bound = FIRST_TOKEN_BUCKETS[bisect.bisect_left(FIRST_TOKEN_BUCKETS, meta["compute_seconds"])]
    assert _value(final, f"{FIRST_TOKEN}_bucket", **day, le=floatToGoString(bound)) == rows
    # Live pushes carried the histogram so far, never more than the day's requests.
    live = [
        v
        for _, _, body in gateway.requests[:-1]  # type: ignore[attr-defined]
        for (name, _), v in _samples(body).items()
        if name == f"{FIRST_TOKEN}_count"
    ]
    assert live and all(0 < v <= rows for v in live)


def test_only_a_day_with_generation_requests_has_first_token_series(gateway) -> None:  # noqa: F811
    url = f"http://127.0.0.1:{gateway.server_address[1]}"
    generation, scoring = BatchMetrics(), BatchMetrics()
    for metrics in (generation, scoring):
        metrics.record_batch(3, 3, 0.5)
    generation.record_first_tokens([0.1, 0.2, 0.4])
    with RunMetrics(MetricsSettings(pushgateway=url, push_seconds=3600), print) as run:
        for date, metrics in ((DAY, generation), (OTHER_DAY, scoring)):
            day = run.day("document_summaries", date, "summaries_job", 3)
            day.shard_done(ShardSeen(3, 0, 1, 0, 0, 0, metrics))
            day.push()
    (_, _, with_requests), (_, _, without) = gateway.requests  # type: ignore[attr-defined]
    samples = _samples(with_requests)
    assert _value(samples, f"{FIRST_TOKEN}_count", partition=DAY) == 3
    assert _value(samples, f"{FIRST_TOKEN}_sum", partition=DAY) == pytest.approx(0.7)
    assert _value(samples, f"{FIRST_TOKEN}_bucket", partition=DAY, le="0.1") == 1
    assert not any(name.startswith(FIRST_TOKEN) for name, _ in _samples(without))
