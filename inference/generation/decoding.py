"""Greedy decoding of token requests by two strategies behind one interface, and ``auto``.

- static (:mod:`inference.generation.static_decoding`): requests in length-bucketed batches (or arrival
  order), each batch run by ``model.generate`` until its longest request is done;
- continuous (:mod:`inference.generation.continuous_decoding`): transformers 5.x continuous batching, where
  a request joins the running batch as soon as another one finishes;
- auto (here): the strategy measured faster on this device for this model (see
  ``generate_tokens``).

Which is faster depends on the device and the model, so it is measured, not assumed: on a
small CPU continuous batching runs behind static batches, on CUDA it is meant to run ahead
(docs/benchmarks.md, "Generation", and workload 4 of ``make bench``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from inference.engine.batching import length_buckets
from inference.generation.continuous_decoding import generate_continuous
from inference.generation.static_decoding import generate_static, static_sizing
from inference.generation.token_run import TokenRun

if TYPE_CHECKING:
    import torch

__all__ = [
    "STRATEGIES",
    "TokenRun",
    "generate_continuous",
    "generate_static",
    "generate_tokens",
    "static_sizing",
]

STRATEGIES = ("static", "continuous", "auto")


def _typical_bucket(plan: list[np.ndarray], limits: np.ndarray) -> np.ndarray:
    """The full bucket whose share of useful decoding steps is closest to the whole plan's.

    A static batch runs until its longest request is done, so its tokens/s follows the share
    of its rows x steps that are useful, which differs a lot between buckets: a bucket picked
    by position, not by that share, misjudges the call's rate. The typical bucket's rate
    stands for the call.
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
    holds both measured rates, the probe's wall time and its cost over the winner. Keeping
    the probe's outputs is what lets a first call beat the better fixed strategy; a probe run
    apart from the real work cost more than it won.

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
# (no tokens for a while, then decoding at full pace), so the fastest window once tokens flow,
# not the mean since the start, is what it is judged by: it is stopped only when behind by
# more than noise. Merely slower, it runs to the end and its results are kept: stopping it then
# would throw away as much time as it saves.
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
        # the requests the first had no room for, at a fraction of the decoding pace.
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
