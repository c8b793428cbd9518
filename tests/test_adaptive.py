"""Out-of-memory back-off: halve and retry the same batch, remember the size, grow back, no storms."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inference.engine.adaptive import AdaptiveBatchSize, BatchTooLargeError, is_out_of_memory
from inference.engine.device import make_runtime
from inference.tabular.tabular import Standardizer, TabularScorer, build_mlp


class FakeDevice:
    """Runs batches like a device with room for ``capacity`` rows: larger ones raise the CUDA
    out-of-memory error, exactly the type torch raises on a GPU."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.calls: list[tuple[int, int]] = []

    def __call__(self, start: int, stop: int) -> list[int]:
        self.calls.append((start, stop))
        if stop - start > self.capacity:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {stop - start} rows"
            )
        return list(range(start, stop))


def test_out_of_memory_halves_and_retries_the_same_batch() -> None:
    device = FakeDevice(capacity=300)
    sizer = AdaptiveBatchSize(1024, patience=100)

    batches = list(sizer.run(5000, device))

    # Every row exactly once, in order, although the first tries did not fit.
    assert [row for _, _, rows in batches for row in rows] == list(range(5000))
    assert device.calls[:3] == [(0, 1024), (0, 512), (0, 256)]
    assert sizer.size == 256 and sizer.failed_at == 512 and sizer.ooms == 2
    # Once a size fits it is kept: no further failures for the rest of the partition.
    assert all(stop - start <= 256 for start, stop in device.calls[3:])
    assert len(device.calls) == len(batches) + 2


def test_size_grows_after_a_run_of_successes_and_backs_off_from_a_known_bad_size() -> None:
    device = FakeDevice(capacity=300)
    sizer = AdaptiveBatchSize(256, maximum=1024, patience=4)

    batches = list(sizer.run(20_000, device))

    assert sum(len(rows) for _, _, rows in batches) == 20_000
    failures = [c for c in device.calls if c[1] - c[0] > 300]
    # The first growth (256 -> 512) fails; each failure at a known-bad size doubles the wait
    # before the next attempt, so failures stay logarithmic in the number of batches.
    assert sizer.grows >= 2 and sizer.ooms == len(failures)
    assert 2 <= len(failures) <= 6
    assert sizer.patience >= 4 * 2 ** (len(failures) - 1)
    assert sizer.history[0] == ("grow", 512) and sizer.history[1] == ("oom", 512)


def test_growth_is_capped_at_the_maximum() -> None:
    sizer = AdaptiveBatchSize(8, maximum=32, patience=1)
    for _ in range(10):
        sizer.record_success()
    assert sizer.size == 32


def test_out_of_memory_at_the_minimum_size_is_raised_not_retried() -> None:
    device = FakeDevice(capacity=0)
    sizer = AdaptiveBatchSize(64, minimum=8)

    with pytest.raises(BatchTooLargeError, match="minimum batch size 8"):
        list(sizer.run(100, device))
    # 64, 32, 16, 8: one try per halving, then it gives up.
    assert [stop - start for start, stop in device.calls] == [64, 32, 16, 8]


def test_other_errors_pass_through_untouched() -> None:
    sizer = AdaptiveBatchSize(16)

    def broken(start: int, stop: int) -> None:
        raise ValueError("feature column 'amount' holds NaN")

    with pytest.raises(ValueError, match="NaN"):
        list(sizer.run(100, broken))
    assert sizer.ooms == 0 and sizer.size == 16


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (torch.cuda.OutOfMemoryError("CUDA out of memory"), True),
        (RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"), True),
        (RuntimeError("shape mismatch"), False),
        (MemoryError(), False),
    ],
)
def test_out_of_memory_recognition(exc: BaseException, expected: bool) -> None:
    assert is_out_of_memory(exc) is expected


def test_invalid_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="minimum"):
        AdaptiveBatchSize(4, minimum=8)
    with pytest.raises(ValueError, match="maximum"):
        AdaptiveBatchSize(64, maximum=32)


class SmallDevice(torch.nn.Module):
    """Wraps a model like a device with room for ``capacity`` rows: a bigger call raises the
    CUDA out-of-memory error, exactly the type torch raises on a GPU."""

    def __init__(self, model: torch.nn.Module, capacity: int):
        super().__init__()
        self.model, self.capacity, self.calls = model, capacity, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(len(x))
        if len(x) > self.capacity:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried {len(x)} rows")
        return self.model(x)


def test_scores_back_off_on_out_of_memory_and_equal_scores_in_one_batch() -> None:
    """The scorer the pipeline uses halves its model calls on OOM and keeps the size that fit."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 6)).astype(np.float32)
    torch.manual_seed(0)
    mlp = build_mlp(6, [16])
    runtime = make_runtime("cpu", "fp32")
    names = [f"f{i}" for i in range(6)]
    expected = TabularScorer(mlp, Standardizer.fit(x), names, 0.5, runtime).score(x)
    device = SmallDevice(mlp, capacity=500)
    scorer = TabularScorer(device, Standardizer.fit(x), names, 0.5, runtime)

    got = scorer.score(x, max_rows=2048)

    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert device.calls[:4] == [2048, 1024, 512, 256]  # the same rows, retried at half size
    # 12 batches fitted at 256; after 8 in a row it tried 512 once more, which failed again.
    assert scorer.batch_sizing(2048).describe() == {
        "model_batch_size": 256, "oom_backoffs": 4, "model_batch_size_grows": 1
    }  # fmt: skip
    assert device.calls.count(512) == 2 and max(device.calls[4:]) == 512
    # The next call (the partition's next batch) starts at the size that fitted: no new OOM.
    device.calls.clear()
    np.testing.assert_allclose(scorer.score(x[:700], max_rows=2048), expected[:700], rtol=1e-6)
    # Every call has the size's shape: the last 188 rows go out padded to 256 (so a row's
    # score does not depend on the rows it shares a call with).
    assert device.calls == [256, 256, 256]
    # A single row that does not fit is a real error, raised once, not retried forever.
    device.capacity = 0
    device.calls.clear()
    with pytest.raises(BatchTooLargeError, match="minimum batch size 1"):
        scorer.score(x[:10], max_rows=2048)
    assert device.calls == [256, 5, 2, 1]  # 10 rows padded to 256, then halved from 10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_real_cuda_out_of_memory_backs_off_to_the_same_scores() -> None:
    """On a GPU capped at 256 MiB, a call that needs gigabytes really runs out of memory: the
    scorer halves until it fits and scores exactly what the CPU scores."""
    import copy

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200_000, 6)).astype(np.float32)
    torch.manual_seed(0)
    mlp = build_mlp(6, [4096])
    names = [f"f{i}" for i in range(6)]
    cuda_mlp = copy.deepcopy(mlp)  # a scorer moves its model to its device
    cpu = TabularScorer(mlp, Standardizer.fit(x), names, 0.5, make_runtime("cpu", "fp32"))
    expected = cpu.score(x, max_rows=8192)
    scorer = TabularScorer(cuda_mlp, Standardizer.fit(x), names, 0.5, make_runtime("cuda", "fp32"))
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(256 * 2**20 / total)
    try:
        # 200,000 rows x 4,096 hidden units in fp32 is 3.3 GB of activations in one call.
        got = scorer.score(x, max_rows=200_000)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    sizing = scorer.batch_sizing(200_000)
    assert sizing.ooms >= 1 and sizing.size < 200_000
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
