"""Greedy decoding of token requests by two strategies behind one interface, and ``auto``.

- static: requests in length-bucketed batches (or arrival order), each batch run by
  ``model.generate`` until its longest request is done;
- continuous: transformers 5.x continuous batching (``init_continuous_batching``), where a
  request joins the running batch as soon as another one finishes;
- auto: the strategy measured faster on this device for this model (see ``generate_tokens``).

Which is faster depends on the device and the model, so it is measured, not assumed: on the
2-core CPU this was built on, continuous batching ran a 4 x 256 random Llama at 0.66x the
tokens/s of static batches of 32 (benchmarks/results.md).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from inference.batching import length_buckets

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
    probe: dict[str, float] = field(default_factory=dict)  # auto: each strategy's measured rate

    @property
    def useful_tokens(self) -> int:
        """Tokens the requests asked for; padding and steps past a request's end are not counted."""
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_second(self) -> float:
        return self.useful_tokens / self.seconds if self.seconds > 0 else 0.0

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
    with torch.inference_mode():
        for batch in batches:
            longest = max(len(prompts[i]) for i in batch)
            ids = torch.full((len(batch), longest), pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(batch), longest), dtype=torch.long)
            for row, i in enumerate(batch):
                ids[row, longest - len(prompts[i]) :] = torch.as_tensor(prompts[i])
                mask[row, longest - len(prompts[i]) :] = 1
            step = _FirstStep()
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
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
    return TokenRun(tokens, "static", time.perf_counter() - began, first, len(batches))


def generate_continuous(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int],
    *,
    eos_token_id: int | None,
    max_batch_size: int,
    max_batch_tokens: int,
    page_size: int = 256,
) -> TokenRun:
    """Greedy generation with transformers' continuous batching (paged KV cache).

    A request joins the running batch as soon as another one finishes, so no step is spent on
    a request that is already done. The KV cache is sized here from the workload (requests in
    flight x their longest sequence) instead of from free device memory, which on a CPU would
    allocate gigabytes for nothing.

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
    manager = model.init_continuous_batching(
        generation_config=config, continuous_batching_config=cb_config, workload_hints=hints
    )
    manager.start()
    results: dict[str, object] = {}
    try:
        for i, (prompt, limit) in enumerate(zip(prompts, max_new_tokens, strict=True)):
            manager.add_request(
                list(prompt), request_id=f"r{i}", max_new_tokens=int(limit), record_timestamps=True
            )
        # Results are drained without a request id: asking for one id returns None whenever
        # another request's result is first in the queue.
        while len(results) < len(prompts):
            result = manager.get_result(timeout=1.0)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError(
                        f"continuous batching stopped with {len(prompts) - len(results)} "
                        "requests unfinished"
                    )
                continue
            if result.is_finished():
                if result.error is not None:
                    raise RuntimeError(f"request {result.request_id} failed: {result.error}")
                results[result.request_id] = result
    finally:
        manager.stop(block=True, timeout=30)
        manager.destroy()
    tokens, first = [], []
    for i, limit in enumerate(max_new_tokens):
        result = results[f"r{i}"]
        tokens.append(_cut(list(result.generated_tokens), int(limit), eos_token_id))
        stamps = result.timestamps or [result.lifespan[1]]
        first.append(stamps[0] - began)
    return TokenRun(tokens, "continuous", time.perf_counter() - began, first)


def _probe_sets(lengths: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint request sets of ``size`` with matching length mixes (alternate by length)."""
    order = np.argsort(lengths, kind="stable")
    picked = order[np.linspace(0, len(order) - 1, 2 * size).round().astype(np.int64)]
    return picked[0::2], picked[1::2]


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

    ``auto`` decides from measurement, not from what is usually true of a device: it runs two
    sets of the real requests (same length mix), one with each strategy, keeps the one with
    more useful tokens per second, and runs the rest with it. The probe's outputs are part of
    the result, so measuring repeats no work; each set is one full batch (``max_batch_size``
    requests), so each strategy is measured at the efficiency it would run at, and the cost
    of measuring is the slower strategy's extra time on one batch. The choice is stored in
    ``decisions`` under the model's device type, so later calls with the same dict (one
    process scoring several partitions) reuse it. A call with fewer than four batches of
    requests and no stored choice runs static without measuring (too little work to measure
    on); encoder-decoder models always run static.

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
    return _probe_then_run(prompts, max_new_tokens, runners, probe, device, decisions)


_Runner = Callable[[Sequence[Sequence[int]], Sequence[int]], TokenRun]


def _probe_then_run(
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int],
    runners: dict[str, _Runner],
    size: int,
    device: str,
    decisions: dict[str, str] | None,
) -> TokenRun:
    began = time.perf_counter()
    limits = np.asarray(max_new_tokens, dtype=np.int64)
    lengths = np.fromiter((len(p) for p in prompts), np.int64, len(prompts)) + limits
    sets = dict(zip(("static", "continuous"), _probe_sets(lengths, size), strict=True))
    tokens: list[list[int]] = [[] for _ in prompts]
    first = [0.0] * len(prompts)
    rates: dict[str, float] = {}
    calls = 0
    for name, rows in sets.items():
        offset = time.perf_counter() - began
        run = runners[name]([prompts[i] for i in rows], limits[rows].tolist())
        rates[name] = run.tokens_per_second
        calls += run.model_calls
        for j, i in enumerate(rows):
            tokens[i], first[i] = run.tokens[j], offset + run.first_token_seconds[j]
    winner = max(rates, key=rates.get)
    if decisions is not None:
        decisions[device] = winner
    rest = np.setdiff1d(np.arange(len(prompts)), np.concatenate(list(sets.values())))
    offset = time.perf_counter() - began
    run = runners[winner]([prompts[i] for i in rest], limits[rest].tolist())
    for j, i in enumerate(rest):
        tokens[i], first[i] = run.tokens[j], offset + run.first_token_seconds[j]
    probe = {f"{k}_tokens_per_second": round(v, 1) for k, v in rates.items()}
    seconds = time.perf_counter() - began
    return TokenRun(tokens, f"auto:{winner}", seconds, first, calls + run.model_calls, probe)
