"""``auto`` decoding: the probe keeps its outputs, every request gets one result, greedy = static."""

from __future__ import annotations

import time

import numpy as np
import torch

from inference.generation import decoding
from inference.generation.decoding import generate_continuous, generate_static, generate_tokens

LIMITS = {"max_batch_size": 4, "max_batch_tokens": 256}


def _requests(n: int, seed: int = 3) -> tuple[list[list[int]], list[int]]:
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, 96, int(k)).tolist() for k in rng.integers(3, 20, n)]
    return prompts, rng.integers(2, 12, n).tolist()


def _auto(llama, prompts, limits, decisions=None, eos=None):
    return generate_tokens(
        llama,
        prompts,
        limits,
        pad_token_id=0,
        eos_token_id=eos,
        decisions=decisions,
        probe_requests=4,
        **LIMITS,
    )


def _static(llama, prompts, limits, eos=None):
    return generate_static(llama, prompts, limits, pad_token_id=0, eos_token_id=eos, **LIMITS)


def test_auto_returns_one_result_per_request_in_input_order_equal_to_static(llama) -> None:
    prompts, limits = _requests(24)
    static = _static(llama, prompts, limits)
    decisions: dict[str, str] = {}

    auto = _auto(llama, prompts, limits, decisions)

    assert auto.probe  # it measured: no stored choice, enough requests
    assert len(auto.tokens) == len(prompts) == len(auto.first_token_seconds)
    assert [len(t) for t in auto.tokens] == limits  # each request generated, to its own limit
    assert auto.tokens == static.tokens
    assert auto.unfinished == []
    assert auto.strategy == f"auto:{decisions['cpu']}"
    assert auto.probe["probe_requests"] == 4
    assert auto.probe["probe_seconds"] <= auto.seconds
    assert len({tuple(t) for t in static.tokens}) > 1


def test_auto_equals_static_with_an_end_of_sequence_token(llama) -> None:
    prompts, limits = _requests(20, seed=7)
    limits = [12] * len(prompts)
    eos = _static(llama, prompts[:1], [12]).tokens[0][3]  # a token the model really produces
    static = _static(llama, prompts, limits, eos)

    auto = _auto(llama, prompts, limits, eos=eos)

    assert auto.tokens == static.tokens
    assert any(len(t) < 12 for t in static.tokens)


def test_continuous_stopped_early_keeps_what_it_finished_and_static_does_the_rest(
    llama, monkeypatch
) -> None:
    # No time at all for continuous: it is "behind" on the first check.
    monkeypatch.setattr(decoding, "DEADLINE", 0.0)
    prompts, limits = _requests(24)
    static = _static(llama, prompts, limits)
    decisions: dict[str, str] = {}

    auto = _auto(llama, prompts, limits, decisions)

    assert auto.probe["continuous_stopped_early"] == 1.0
    assert decisions == {"cpu": "static"} and auto.strategy == "auto:static"
    assert auto.tokens == static.tokens
    assert [len(t) for t in auto.tokens] == limits


def test_when_static_is_slower_continuous_runs_the_rest(llama, monkeypatch) -> None:
    real = decoding.generate_static

    def slow_static(*args, **kwargs):
        run = real(*args, **kwargs)
        time.sleep(2.0)  # a device where static batches are slow
        run.seconds += 2.0
        return run

    monkeypatch.setattr(decoding, "generate_static", slow_static)
    prompts, limits = _requests(24)
    static = _static(llama, prompts, limits)
    decisions: dict[str, str] = {}

    auto = _auto(llama, prompts, limits, decisions)

    assert decisions == {"cpu": "continuous"} and auto.strategy == "auto:continuous"
    assert auto.probe["continuous_stopped_early"] == 0.0
    rates = auto.probe
    assert rates["continuous_tokens_per_second"] > rates["static_tokens_per_second"]
    assert auto.tokens == static.tokens


def test_a_stored_choice_is_reused_without_probing(llama) -> None:
    prompts, limits = _requests(24)
    for choice in ("static", "continuous"):
        run = _auto(llama, prompts, limits, {"cpu": choice})
        assert run.strategy == f"auto:{choice}" and run.probe == {}
        assert run.tokens == _static(llama, prompts, limits).tokens


def test_continuous_told_to_give_up_lists_the_unfinished_requests(llama) -> None:
    prompts, limits = _requests(12)
    seen: list[tuple[float, int]] = []

    def give_up(elapsed: float, produced: int) -> bool:
        seen.append((elapsed, produced))
        return True

    run = generate_continuous(llama, prompts, limits, eos_token_id=None, give_up=give_up, **LIMITS)

    assert seen
    assert run.unfinished  # stopped at the first check, before all 12 were done
    done = [i for i in range(len(prompts)) if i not in run.unfinished]
    reference = _static(llama, prompts, limits).tokens
    assert all(run.tokens[i] == [] for i in run.unfinished)
    assert all(run.tokens[i] == reference[i] for i in done)
    assert run.busy_seconds is not None and run.busy_seconds <= run.seconds


class SmallDevice(torch.nn.Module):
    """Generates like a device with room for ``capacity`` padded tokens (prompt + new) per
    call: a bigger call raises the CUDA out-of-memory error, the type torch raises on a GPU."""

    def __init__(self, model: torch.nn.Module, capacity: int):
        super().__init__()
        self.model, self.capacity, self.calls = model, capacity, []

    def generate(self, input_ids, max_new_tokens, **kwargs):
        tokens = input_ids.shape[0] * (input_ids.shape[1] + max_new_tokens)
        self.calls.append(tokens)
        if tokens > self.capacity:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory ({tokens} tokens)")
        return self.model.generate(input_ids=input_ids, max_new_tokens=max_new_tokens, **kwargs)


def test_static_batches_back_off_on_out_of_memory_to_the_same_tokens(llama) -> None:
    prompts, limits = _requests(24)
    expected = _static(llama, prompts, limits).tokens
    device = SmallDevice(llama, capacity=70)

    run = _static(device, prompts, limits)

    assert run.tokens == expected  # greedy: a request's tokens do not depend on its batch
    sizing = decoding.static_sizing(device, LIMITS["max_batch_tokens"])
    failed = [c for c in device.calls if c > 70]
    assert sizing.ooms == len(failed) >= 1 and sizing.history[0][0] == "oom"
    assert run.model_calls == len(device.calls) - len(failed)  # every request generated once
    # The budget is the model's, kept for its later calls; the unwrapped model's is untouched.
    assert decoding.static_sizing(device, LIMITS["max_batch_tokens"]) is sizing
    assert decoding.static_sizing(llama, LIMITS["max_batch_tokens"]).ooms == 0
