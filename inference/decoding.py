"""Greedy decoding of token requests by two strategies behind one interface, and ``auto``.

- static: requests in length-bucketed batches (or arrival order), each batch run by
  ``model.generate`` until its longest request is done;
- continuous: transformers 5.x continuous batching (``init_continuous_batching``), where a
  request joins the running batch as soon as another one finishes;
- auto: the strategy measured faster on this device for this model (see ``generate_tokens``).

Which is faster depends on the device and the model, so it is measured, not assumed: on the
2-core CPU this was built on, continuous batching ran a 4 x 256 random Llama at 0.72-0.77x the
tokens/s of static batches of 32 (0.63-0.66x before its teardown's gc passes were cut, see
generate_continuous; ``python -m benchmarks.bench --only generation``).
"""

from __future__ import annotations

import gc
import importlib.util
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from inference.adaptive import AdaptiveBatchSize, BatchSizes
from inference.batching import length_buckets
from inference.device import to_device

STRATEGIES = ("static", "continuous", "auto")


@dataclass
class TokenRun:
    """Greedy continuations of a set of requests, in input order, and what producing them cost.

    ``first_token_seconds[i]`` is when request i's first new token was produced, counted from
    the start of the call: a static batch produces all its first tokens after its prefill, a
    continuous batch as soon as the request is scheduled.
    """

    tokens: list[list[int]]
    strategy: str
    seconds: float
    first_token_seconds: list[float]
    model_calls: int = 0
    probe: dict[str, float] = field(default_factory=dict)  # auto: rates, cost (see generate_tokens)
    # Seconds until the last result was produced: ``seconds`` less the teardown (continuous
    # batching stops a background thread and frees its cache after the last result).
    busy_seconds: float | None = None
    # Requests given up on (continuous, when told to stop early): their ``tokens`` are empty.
    unfinished: list[int] = field(default_factory=list)

    @property
    def useful_tokens(self) -> int:
        """Tokens the requests asked for; padding and steps past a request's end are not counted."""
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_second(self) -> float:
        return self.useful_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def busy_tokens_per_second(self) -> float:
        """Useful tokens per second of generating, per-call teardown excluded."""
        busy = self.seconds if self.busy_seconds is None else self.busy_seconds
        return self.useful_tokens / busy if busy > 0 else 0.0

    def first_token_percentiles(self) -> dict[str, float]:
        if not self.first_token_seconds:
            return {}
        values = np.percentile(self.first_token_seconds, [50, 95])
        return {"ttft_p50_s": float(values[0]), "ttft_p95_s": float(values[1])}


class _FirstStep:
    """A stopping criterion that never stops: it notes when a batch's first token exists."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        if self.at is None:
            self.at = time.perf_counter()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _cut(tokens: list[int], limit: int, eos_token_id: int | None) -> list[int]:
    tokens = tokens[:limit]
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[: tokens.index(eos_token_id) + 1]
    return tokens


def generate_static(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int],
    *,
    pad_token_id: int,
    eos_token_id: int | None,
    max_batch_size: int,
    max_batch_tokens: int,
    bucketed: bool = True,
) -> TokenRun:
    """Greedy generation in static batches: each batch runs until its longest request is done.

    Args:
        model: a decoder-only model (prompts are left-padded).
        prompts: token ids per request.
        max_new_tokens: tokens to generate per request.
        pad_token_id: the padding token.
        eos_token_id: stops a request early; None generates exactly ``max_new_tokens``.
        max_batch_size: requests per ``generate`` call.
        max_batch_tokens: padded tokens (prompt + new) per call, when ``bucketed``.
        bucketed: group requests of similar total length (prompt + new tokens) under the token
            budget; False takes them in arrival order, ``max_batch_size`` at a time.
    """
    from transformers import StoppingCriteriaList

    began = time.perf_counter()
    limits = np.asarray(max_new_tokens, dtype=np.int64)
    if bucketed:
        lengths = np.fromiter((len(p) for p in prompts), np.int64, len(prompts)) + limits
        batches = length_buckets(lengths, max_batch_tokens, max_batch_size)
    else:
        batches = [
            np.arange(i, min(i + max_batch_size, len(prompts)))
            for i in range(0, len(prompts), max_batch_size)
        ]
    device = next(model.parameters()).device
    tokens: list[list[int]] = [[] for _ in prompts]
    first = [0.0] * len(prompts)
    # Bucketed batches keep to a padded-token budget, arrival-order ones to a request count.
    budget = _sizing(
        model,
        "tokens" if bucketed else "requests",
        max_batch_tokens if bucketed else max_batch_size,
    )

    def call(batch: np.ndarray) -> None:
        longest = max(len(prompts[i]) for i in batch)
        ids = torch.full((len(batch), longest), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, longest - len(prompts[i]) :] = torch.as_tensor(prompts[i])
            mask[row, longest - len(prompts[i]) :] = 1
        step = _FirstStep()
        out = model.generate(
            input_ids=to_device(ids, device),
            attention_mask=to_device(mask, device),
            max_new_tokens=int(limits[batch].max()),
            do_sample=False,
            num_beams=1,
            pad_token_id=pad_token_id,
            eos_token_id=eos_token_id,
            stopping_criteria=StoppingCriteriaList([step]),
        )
        new = out[:, longest:].tolist()
        for row, i in enumerate(batch):
            tokens[i] = _cut(new[row], int(limits[i]), eos_token_id)
            first[i] = (step.at or time.perf_counter()) - began

    calls = 0
    with torch.inference_mode():
        for batch in batches:
            # A batch that runs out of memory is generated again as smaller ones (the budget
            # halves, and is kept for later batches and calls); a request's tokens do not
            # depend on its batch under greedy decoding.
            width = int(max(len(prompts[i]) + limits[i] for i in batch)) if bucketed else 1
            parts = budget.run(len(batch), lambda a, b, rows=batch: call(rows[a:b]), width)
            calls += sum(1 for _ in parts)
    return TokenRun(tokens, "static", time.perf_counter() - began, first, calls)


# What fits each model's device per generate call, per kind and configured limit.
_SIZING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _sizing(model: torch.nn.Module, kind: str, limit: int) -> AdaptiveBatchSize:
    """Static batches' size for ``model`` (padded ``tokens`` or ``requests``): starts at (and
    never exceeds) ``limit``, halves on out-of-memory, grows back after a run of successes,
    and is kept across calls so later batches start at the size that fitted."""
    if model not in _SIZING:
        _SIZING[model] = BatchSizes()
    return _SIZING[model].at(limit, kind)


def static_sizing(model: torch.nn.Module, max_batch_tokens: int) -> AdaptiveBatchSize:
    """The padded-token budget that bucketed static batches of ``model`` run under now."""
    return _sizing(model, "tokens", max_batch_tokens)


def generate_continuous(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int],
    *,
    eos_token_id: int | None,
    max_batch_size: int,
    max_batch_tokens: int,
    page_size: int = 256,
    give_up: Callable[[float, int], bool] | None = None,
) -> TokenRun:
    """Greedy generation with transformers' continuous batching (paged KV cache).

    A request joins the running batch as soon as another one finishes, so no step is spent on
    a request that is already done. The KV cache is sized here from the workload (requests in
    flight x their longest sequence) instead of from free device memory, which on a CPU would
    allocate gigabytes for nothing.

    Args:
        give_up: called about every 20 ms with (seconds since the start, tokens generated so
            far, finished or not); True stops the run: the requests not finished by then are
            listed in ``TokenRun.unfinished`` with no tokens (``auto`` uses it to stop probing a
            strategy that is clearly behind).
        (others): as for :func:`generate_static`.

    Raises:
        ValueError: the model is an encoder-decoder (continuous batching is decoder-only).
        RuntimeError: a request failed or the generation loop stopped early.
    """
    from transformers import ContinuousBatchingConfig, GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("continuous batching needs a decoder-only model; use the static strategy")
    began = time.perf_counter()
    if not prompts:
        return TokenRun([], "continuous", 0.0, [])
    longest = max(len(p) for p in prompts) + int(max(max_new_tokens))
    in_flight = min(max_batch_size, len(prompts))
    blocks_per_request = -(-longest // page_size) + 1
    cb_config = ContinuousBatchingConfig(
        # Only switch to flash attention when its package is installed: the kernels-hub
        # fallback would try to download one, and nothing here may be downloaded.
        auto_switch_to_flash=importlib.util.find_spec("flash_attn") is not None,
        page_size=page_size,
        num_blocks=in_flight * blocks_per_request + 2,
        max_batch_tokens=max(max_batch_tokens // 4, longest),
        max_requests_per_batch=in_flight,
        allow_block_sharing=False,
    )
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=int(max(max_new_tokens)),
        eos_token_id=-1 if eos_token_id is None else eos_token_id,
        pad_token_id=0 if eos_token_id is None else eos_token_id,
    )
    hints = WorkloadHints(
        max_prompt_length=max(len(p) for p in prompts),
        max_generated_length=int(max(max_new_tokens)),
        num_requests=len(prompts),
    )
    # Stopping the manager runs gc.collect() twice (in stop() and in the batch processor's
    # __del__), each a full pass over the whole process heap: 0.24-0.32 s apiece on the 2-core
    # CPU with dagster imported (profiled: stop() took 0.76 s after 32 requests of 8
    # tokens that ran in 0.55 s). Freezing the heap as it was before the call leaves those
    # passes only the objects made here (the manager, its KV cache: still freed as intended).
    frozen = gc.get_freeze_count() == 0
    if frozen:
        gc.freeze()
    manager = model.init_continuous_batching(
        generation_config=config, continuous_batching_config=cb_config, workload_hints=hints
    )
    results: dict[str, object] = {}
    finished_tokens = 0
    stopped_early = False
    done_at = 0.0
    try:
        manager.start()
        for i, (prompt, limit) in enumerate(zip(prompts, max_new_tokens, strict=True)):
            manager.add_request(
                list(prompt), request_id=f"r{i}", max_new_tokens=int(limit), record_timestamps=True
            )
        # Results are drained without a request id: asking for one id returns None whenever
        # another request's result is first in the queue.
        while len(results) < len(prompts):
            result = manager.get_result(timeout=1.0 if give_up is None else 0.02)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError(
                        f"continuous batching stopped with {len(prompts) - len(results)} "
                        "requests unfinished"
                    )
            elif result.is_finished():
                if result.error is not None:
                    raise RuntimeError(f"request {result.request_id} failed: {result.error}")
                results[result.request_id] = result
                finished_tokens += len(result.generated_tokens)
                done_at = time.perf_counter() - began
            if give_up is not None and len(results) < len(prompts):
                elapsed = time.perf_counter() - began
                if give_up(elapsed, finished_tokens + _tokens_in_flight(manager)):
                    stopped_early, done_at = True, elapsed
                    break
    finally:
        manager.stop(block=True, timeout=30, hard_stop=stopped_early)
        manager.destroy()
        if frozen:
            gc.unfreeze()
    tokens, first, unfinished = [], [], []
    for i, limit in enumerate(max_new_tokens):
        result = results.get(f"r{i}")
        if result is None:
            tokens.append([])
            first.append(done_at)
            unfinished.append(i)
            continue
        tokens.append(_cut(list(result.generated_tokens), int(limit), eos_token_id))
        stamps = result.timestamps or [result.lifespan[1]]
        first.append(stamps[0] - began)
    seconds = time.perf_counter() - began
    return TokenRun(
        tokens, "continuous", seconds, first, busy_seconds=done_at, unfinished=unfinished
    )


def _tokens_in_flight(manager: object) -> int:
    """Tokens generated so far by the requests still running (0 where that cannot be read).

    Reads the scheduler of transformers 5.x's batch processor; it is only a progress signal,
    so a version that lays it out differently makes ``auto`` wait for finished requests.
    """
    try:
        states = list(manager.batch_processor.scheduler.active_requests.values())
        return sum(state.generated_len() for state in states)
    except (AttributeError, RuntimeError):
        return 0


def _typical_bucket(plan: list[np.ndarray], limits: np.ndarray) -> np.ndarray:
    """The full bucket whose share of useful decoding steps is closest to the whole plan's.

    A static batch runs until its longest request is done, so its tokens/s follows the share
    of its rows x steps that are useful, which differs a lot between buckets: 0.42 to 0.87 in
    the benchmark's 8 buckets (0.62 over all), and the middle bucket (0.47) ran at 1,516
    tokens/s against 2,261 for the whole call. The typical bucket's rate stands for the call.
    """
    steps = [len(b) * int(limits[b].max()) for b in plan]
    overall = limits.sum() / max(sum(steps), 1)
    largest = max(len(b) for b in plan)
    return min(
        (b for b, n in zip(plan, steps, strict=True) if len(b) == largest),
        key=lambda b: abs(limits[b].sum() / max(len(b) * int(limits[b].max()), 1) - overall),
    )


def _matched(prompt_lengths: np.ndarray, limits: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For each of ``rows``, the closest other request by (prompt length, new tokens), unshared.

    The two probe sets then hold the same mix of lengths, so their tokens/s compare directly.
    """
    free = np.ones(len(limits), dtype=bool)
    free[rows] = False
    picked = []
    for i in rows:
        if not free.any():
            break
        distance = np.abs(prompt_lengths - prompt_lengths[i]) + np.abs(limits - limits[i])
        j = int(np.argmin(np.where(free, distance, np.iinfo(np.int64).max)))
        picked.append(j)
        free[j] = False
    return np.asarray(picked, dtype=np.int64)


def generate_tokens(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int],
    *,
    strategy: str = "auto",
    pad_token_id: int,
    eos_token_id: int | None,
    max_batch_size: int,
    max_batch_tokens: int,
    decisions: dict[str, str] | None = None,
    probe_requests: int | None = None,
) -> TokenRun:
    """Greedy generation with a chosen strategy, or ``auto``: the one measured faster here.

    ``auto`` decides from measurement, not from what is usually true of a device: it runs one
    batch of the real requests with each strategy (the same length mix for both), keeps the one
    with more useful tokens per second and runs the rest with it (see :func:`_probe_then_run`).
    The probe's outputs are part of the result, so no request is generated twice unless the
    continuous probe is stopped early, and then only the requests it had not finished. Static's
    probe batch is one of its own length buckets, so when static wins the probe costs only the
    continuous batch's extra time, cut short once it is clearly behind. ``TokenRun.probe``
    holds both measured rates, the probe's wall time and its cost over the winner.

    Measured (``NIGHTSHIFT_CPU_THREADS=1 python -m benchmarks.bench --only generation``, 2-core
    CPU, 256 requests, 4 x 256 random Llama): the earlier probe (two spread-out sets of 32, one
    per strategy, each run to completion) cost ~1.6 s of a 7.7 s call: first call 0.95-0.97x of
    the better of continuous and static-32. This one, three runs: 1.11x, 1.05x, 1.11x (0.93x,
    0.89x, 0.93x of static length-bucketed run alone; probe cost 0.51-0.60 s, continuous run to
    the end of its 32 requests at 1,479-1,756 tokens/s against static's 2,066-2,416, so static
    kept); once decided 1.18-1.21x.

    The choice is stored in ``decisions`` under the model's device type, so later calls with
    the same dict (one process scoring several partitions) reuse it. A call with fewer than
    four batches of requests and no stored choice runs static without measuring (too little
    work to measure on); encoder-decoder models always run static.

    Args:
        strategy: ``static``, ``continuous`` or ``auto``.
        decisions: where ``auto`` keeps its choice per device type (None: decide every call).
        probe_requests: requests per strategy in the probe (default ``max_batch_size``).
        (others): as for :func:`generate_static` and :func:`generate_continuous`.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy '{strategy}': expected one of {', '.join(STRATEGIES)}")
    limits = {"max_batch_size": max_batch_size, "max_batch_tokens": max_batch_tokens}
    runners: dict[str, _Runner] = {
        "static": partial(
            generate_static, model, pad_token_id=pad_token_id, eos_token_id=eos_token_id, **limits
        ),
        "continuous": partial(generate_continuous, model, eos_token_id=eos_token_id, **limits),
    }
    if strategy != "auto":
        return runners[strategy](prompts, max_new_tokens)
    device = next(model.parameters()).device.type
    known = (decisions or {}).get(device)
    if getattr(model.config, "is_encoder_decoder", False):
        known = "static"
    probe = probe_requests or max_batch_size
    if known is not None or len(prompts) < 4 * probe:
        run = runners[known or "static"](prompts, max_new_tokens)
        run.strategy = f"auto:{known or 'static'}"
        return run
    return _probe_then_run(
        prompts, max_new_tokens, runners, probe, device, decisions, max_batch_size, max_batch_tokens
    )


_Runner = Callable[..., TokenRun]  # (prompts, max_new_tokens, **options)


# The probe stops running continuous batching once it is clearly behind static: when even at
# the fastest pace it has shown over any window of PACE_WINDOW x static's time, it would finish
# its set after BEHIND x static's time for the same work (judged once tokens have flowed for
# OBSERVE x that time), or when DEADLINE x that time has passed. Its first step is all prefill
# (0.45-0.6 s of nothing, then ~2,700 tokens/s of decoding on the 2-core CPU, measured by
# polling one bucket of the benchmark), so the fastest window once tokens flow, not the mean
# since the start, is what it is judged by: it is stopped only when behind by more than noise.
# On the benchmark it
# is not (its 32 requests take ~1.4-1.6x static's time), so it runs to the end and its results
# are kept: stopping it then would throw away as much time as it saves.
BEHIND = 1.5
DEADLINE = 2.0
PACE_WINDOW = 0.1
OBSERVE = 0.3


def _probe_then_run(
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int],
    runners: dict[str, _Runner],
    size: int,
    device: str,
    decisions: dict[str, str] | None,
    max_batch_size: int,
    max_batch_tokens: int,
) -> TokenRun:
    """``auto`` without a stored choice: measure both strategies on real requests, run the rest.

    1. Static runs one batch of the very plan it would run for the whole call (the typical
       one, see :func:`_typical_bucket`): if static wins, this probe cost nothing.
    2. Continuous runs as many other requests, matched one to one by prompt length and new
       tokens, so the two sets are the same work; it is stopped early once clearly behind (see
       BEHIND), keeping the requests it finished.
    3. The faster by useful tokens per second (continuous's teardown, a per-call cost, left
       out) runs every request not yet done. Each request is generated to completion once.
    """
    began = time.perf_counter()
    limits = np.asarray(max_new_tokens, dtype=np.int64)
    prompt_lengths = np.fromiter((len(p) for p in prompts), np.int64, len(prompts))
    plan = length_buckets(prompt_lengths + limits, max_batch_tokens, max_batch_size)
    static_rows = _typical_bucket(plan, limits)[:size]
    continuous_rows = _matched(prompt_lengths, limits, static_rows)
    tokens: list[list[int]] = [[] for _ in prompts]
    first = [0.0] * len(prompts)
    done = np.zeros(len(prompts), dtype=bool)

    def run_rows(name: str, rows: np.ndarray, **kwargs) -> TokenRun:
        offset = time.perf_counter() - began
        run = runners[name]([prompts[i] for i in rows], limits[rows].tolist(), **kwargs)
        skipped = set(run.unfinished)
        for j, i in enumerate(rows):
            if j not in skipped:
                tokens[i], first[i] = run.tokens[j], offset + run.first_token_seconds[j]
                done[i] = True
        return run

    static = run_rows("static", static_rows)
    # Static's time for the continuous set's work (same length mix; with an end-of-sequence
    # token, the share of the limits static really generated stands for both sets).
    share = limits[continuous_rows].sum() / max(limits[static_rows].sum(), 1)
    static_time = static.seconds * share
    expected = static.useful_tokens * share
    pace: list[tuple[float, int]] = []
    fastest = 0.0

    def behind(elapsed: float, produced: int) -> bool:
        nonlocal fastest
        pace.append((elapsed, produced))
        if elapsed > DEADLINE * static_time:
            return True
        # Windows start once tokens flow: the first step's burst of first tokens (prefill) is
        # no measure of the pace of decoding.
        flowing = [(t, n) for t, n in pace if n > 0]
        window = [(t, n) for t, n in flowing if t <= elapsed - PACE_WINDOW * static_time]
        if window:
            t, n = window[-1]
            fastest = max(fastest, (produced - n) / (elapsed - t))
        # Judged only after several windows of flow: the second step may still be prefilling
        # the requests the first had no room for (a pace of ~900 tokens/s, then ~2,700).
        observed = bool(flowing) and elapsed - flowing[0][0] >= OBSERVE * static_time
        if not observed:
            return False
        remaining = max(expected - produced, 0)
        return fastest <= 0 or elapsed + remaining / fastest > BEHIND * static_time

    continuous = run_rows("continuous", continuous_rows, give_up=behind)
    gave_up = bool(continuous.unfinished)
    rates = {
        "static": static.busy_tokens_per_second,
        # Stopped early: the tokens it had generated, finished or not, over the time it ran.
        "continuous": pace[-1][1] / pace[-1][0] if gave_up else continuous.busy_tokens_per_second,
    }
    winner = "static" if gave_up else max(rates, key=rates.get)
    if decisions is not None:
        decisions[device] = winner
    probe_seconds = time.perf_counter() - began
    probe_tokens = static.useful_tokens + continuous.useful_tokens
    rest = np.flatnonzero(~done)
    run = run_rows(winner, rest)
    probe = {f"{k}_tokens_per_second": round(v, 1) for k, v in rates.items()}
    probe.update(
        probe_requests=float(len(static_rows)),
        continuous_stopped_early=float(gave_up),
        probe_seconds=round(probe_seconds, 3),
        # What probing cost over running the probe's finished requests with the winner at
        # its measured rate: the slower strategy's extra time, work given up, teardowns.
        probe_cost_seconds=round(probe_seconds - probe_tokens / max(rates[winner], 1e-9), 3),
    )
    seconds = time.perf_counter() - began
    calls = static.model_calls + continuous.model_calls + run.model_calls
    return TokenRun(tokens, f"auto:{winner}", seconds, first, calls, probe)
