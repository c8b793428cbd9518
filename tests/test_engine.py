"""Unit tests of the plain engine library: batching, prefetch, devices, the model store."""

from __future__ import annotations

import platform
import threading

import numpy as np
import pyarrow as pa
import pytest
import torch

from inference.engine.batching import (
    Behind,
    Prefetcher,
    length_buckets,
    padding_ratio,
    prefetch,
    rebatch,
)
from inference.engine.device import (
    limit_malloc_arenas,
    make_runtime,
    resolve_device,
    resolve_dtype,
    to_device,
)
from inference.engine.metrics import BatchMetrics
from inference.models.modelstore import ModelNotFoundError, load_model, save_model
from inference.tabular.tabular import Standardizer, TabularScorer, build_mlp
from resources.storage import DataStore


def _stream(sizes: list[int]) -> list[pa.RecordBatch]:
    out, start = [], 0
    for n in sizes:
        out.append(pa.record_batch({"x": np.arange(start, start + n)}))
        start += n
    return out


@pytest.mark.parametrize("sizes", [[10], [3, 3, 3], [7, 0, 1, 25], [1] * 17, []])
@pytest.mark.parametrize("size", [1, 4, 8, 100])
def test_rebatch_keeps_every_row_in_order(sizes: list[int], size: int) -> None:
    batches = list(rebatch(_stream(sizes), size))
    values = [v for b in batches for v in b.column("x").to_pylist()]
    assert values == list(range(sum(sizes)))
    assert all(b.num_rows == size for b in batches[:-1])
    assert not batches or 0 < batches[-1].num_rows <= size


def test_rebatch_rejects_non_positive_size() -> None:
    with pytest.raises(ValueError, match="positive"):
        list(rebatch(_stream([3]), 0))


def test_length_buckets_respect_budget_and_cover_all_items() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 300, size=1000)
    batches = length_buckets(lengths, max_batch_tokens=4096, max_batch_size=64)
    covered = np.sort(np.concatenate(batches))
    assert np.array_equal(covered, np.arange(1000))
    for b in batches:
        assert len(b) <= 64
        assert len(b) * lengths[b].max() <= 4096 or len(b) == 1
    # Sorting by length keeps padding small; the same sizes in input order pad far more.
    unsorted = [np.arange(i, min(i + 16, 1000)) for i in range(0, 1000, 16)]
    assert padding_ratio(lengths, batches) < 0.1 < padding_ratio(lengths, unsorted)


def test_length_buckets_give_an_oversized_item_its_own_batch() -> None:
    batches = length_buckets([10, 5000, 10], max_batch_tokens=100, max_batch_size=8)
    assert [list(b) for b in batches][0] == [1]


def test_prefetch_yields_in_order_and_reraises_producer_errors() -> None:
    assert list(prefetch(iter(range(50)), depth=3)) == list(range(50))

    def broken():
        yield 1
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        list(prefetch(broken()))


def test_prefetch_stops_its_thread_when_the_consumer_leaves_early() -> None:
    stream = prefetch(iter(range(10_000)), depth=2)
    assert next(stream) == 0
    stream.close()


def test_a_consumer_leaving_early_closes_a_chain_of_prefetchers_at_once() -> None:
    # A stage reading from another prefetcher (the fraud cut reads, routes and writes on three
    # threads): leaving the outer one closes the stage's generator, whose own cleanup stops
    # the inner thread, before close() returns rather than whenever the generator is collected.
    closed: list[str] = []

    def source():
        try:
            yield from range(10_000)
        finally:
            closed.append("source")

    def stage(items):
        try:
            for item in items:
                yield item * 2
        finally:
            closed.append("stage")

    stream = iter(Prefetcher(stage(Prefetcher(source(), depth=2)), depth=2))
    assert [next(stream), next(stream)] == [0, 2]
    stream.close()
    assert sorted(closed) == ["source", "stage"]


def test_behind_runs_calls_in_order_one_behind_and_reraises_their_errors() -> None:
    seen: list[int] = []
    running = threading.Event()
    release = threading.Event()

    def slow(i: int) -> None:
        running.set()
        release.wait(5)
        seen.append(i)

    behind = Behind()
    try:
        behind.submit(slow, 0)
        assert running.wait(5) and seen == []  # the caller goes on while call 0 runs
        release.set()
        for i in range(1, 20):
            behind.submit(seen.append, i)  # waits for the previous call first
            assert seen == list(range(i))
        behind.wait()
        assert seen == list(range(20))

        def broken() -> None:
            raise OSError("disk gone")

        behind.submit(broken)
        with pytest.raises(OSError, match="disk gone"):
            behind.submit(seen.append, 99)  # the failure surfaces at the next call
        assert seen[-1] == 19
    finally:
        behind.close()


def test_malloc_arenas_are_capped_unless_the_user_chose_a_cap(monkeypatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_malloc_arenas() is (platform.libc_ver()[0] == "glibc")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")  # glibc read it at start: it stands
    assert limit_malloc_arenas() is False


def test_device_resolution() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda", "mps")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="unknown precision"):
        resolve_dtype("fp8", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            resolve_device("cuda:0")


def _devices() -> list[str]:
    return ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", _devices())
def test_to_device_copies_to_the_device_and_pins_on_cuda(device: str) -> None:
    host = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    moved = to_device(host, torch.device(device))
    assert moved.device.type == device and torch.equal(moved.cpu(), host)
    if device == "cpu":
        assert moved is host  # no copy on the CPU
    else:
        assert not host.is_pinned()  # the caller's tensor is left as it was
        assert to_device(host.pin_memory(), torch.device(device)).device.type == "cuda"


@pytest.mark.parametrize("device", _devices())
def test_scoring_in_model_calls_equals_one_call(device: str) -> None:
    """Model calls are queued with one read-back at the end; chunking must not change a score."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1_003, 5)).astype(np.float32)
    torch.manual_seed(1)
    scorer = TabularScorer(
        build_mlp(5, [8]), Standardizer.fit(x), [f"f{i}" for i in range(5)], 0.5,
        make_runtime(device, "fp32"),
    )  # fmt: skip
    whole = scorer.score(x)
    assert whole.dtype == np.float32 and whole.shape == (1_003,)
    for rows in (1, 100, 1_002, 5_000):
        np.testing.assert_allclose(scorer.score(x, max_rows=rows), whole, rtol=1e-6, atol=1e-6)
    assert scorer.score(x[:0], max_rows=100).shape == (0,)


def test_metrics_summarise_batches() -> None:
    m = BatchMetrics()
    m.record_batch(100, 100, 0.1)
    m.record_batch(50, 50, 0.05)
    d = m.finish().as_dict()
    assert d["rows_in"] == 150 and d["batch_count"] == 2 and d["mean_batch_size"] == 75.0


def test_model_store_round_trip_and_integrity(store: DataStore) -> None:
    tensors = {"w": torch.randn(4, 3), "b": torch.zeros(3)}
    manifest = {"features": ["a", "b", "c", "d"], "metrics": {"auprc": 0.9}}
    version = save_model(store.write_bytes, store.models_dir, "m", tensors, manifest)
    loaded = load_model(store.read_bytes, store.models_dir, "m", version)
    assert loaded.version == version and loaded.manifest["features"] == manifest["features"]
    assert all(torch.equal(loaded.tensors[k], tensors[k]) for k in tensors)
    # Same content, same version; new content, new version (aliases are the registry's).
    assert save_model(store.write_bytes, store.models_dir, "m", tensors, manifest) == version
    v2 = save_model(store.write_bytes, store.models_dir, "m", {"w": torch.ones(1)}, manifest)
    assert v2 != version and load_model(store.read_bytes, store.models_dir, "m", v2).version == v2
    assert load_model(store.read_bytes, store.models_dir, "m", version).version == version
    # Tampered weights fail the content hash instead of loading silently.
    store.write_bytes(
        f"{store.models_dir}/m/{version}/model.safetensors",
        store.read_bytes(f"{store.models_dir}/m/{v2}/model.safetensors"),
    )
    with pytest.raises(ValueError, match="content hash"):
        load_model(store.read_bytes, store.models_dir, "m", version)
    with pytest.raises(ModelNotFoundError, match="has not been trained"):
        load_model(store.read_bytes, store.models_dir, "absent")
