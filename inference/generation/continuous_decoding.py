"""Continuous batching: transformers 5.x ``init_continuous_batching``, where a request joins the
running batch as soon as another one finishes. Only its public API is used: the manager's
``start``, ``add_request``, ``get_result``, ``is_running``, ``stop`` and ``destroy``."""

from __future__ import annotations

import gc
import importlib.util
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from inference.generation.token_run import TokenRun, cut_tokens

if TYPE_CHECKING:
    import torch


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
        give_up: called as results arrive, and at least every 20 ms, with (seconds since the
            start, tokens generated so far, finished or not); True stops the run: the requests
            not finished by then are listed in ``TokenRun.unfinished`` with no tokens (``auto``
            uses it to stop probing a strategy that is clearly behind). With it, requests
            stream their tokens, which is how the count includes the requests still running.
        (others): as for :func:`inference.generation.static_decoding.generate_static`.

    Raises:
        ValueError: the model is an encoder-decoder (continuous batching is decoder-only).
        RuntimeError: a request failed or the generation loop stopped early.
    """
    from transformers import ContinuousBatchingConfig, GenerationConfig

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
    # Stopping the manager runs gc.collect() twice (in stop() and in the batch processor's
    # __del__), each a full pass over the whole process heap, which in a process with dagster
    # imported can cost more than a short call's decoding. Freezing the heap as it was before
    # the call leaves those passes only the objects made here (the manager, its KV cache: still
    # freed as intended).
    frozen = gc.get_freeze_count() == 0
    if frozen:
        gc.freeze()
    manager = model.init_continuous_batching(
        generation_config=config, continuous_batching_config=cb_config
    )
    results: dict[str, object] = {}
    produced: dict[str, int] = {}  # tokens so far per request, from its latest result
    stopped_early = False
    done_at = 0.0
    try:
        manager.start()
        for i, (prompt, limit) in enumerate(zip(prompts, max_new_tokens, strict=True)):
            manager.add_request(
                list(prompt),
                request_id=f"r{i}",
                max_new_tokens=int(limit),
                streaming=give_up is not None,
                record_timestamps=True,
            )
        while len(results) < len(prompts):
            polled = _next_results(manager, timeout=1.0 if give_up is None else 0.02)
            if not polled and not manager.is_running():
                raise RuntimeError(
                    f"continuous batching stopped with {len(prompts) - len(results)} "
                    "requests unfinished"
                )
            for result in polled:
                produced[result.request_id] = len(result.generated_tokens)
                if result.is_finished():
                    if result.error is not None:
                        raise RuntimeError(f"request {result.request_id} failed: {result.error}")
                    results[result.request_id] = result
                    done_at = time.perf_counter() - began
            if give_up is not None and len(results) < len(prompts):
                elapsed = time.perf_counter() - began
                if give_up(elapsed, sum(produced.values())):
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
        tokens.append(cut_tokens(list(result.generated_tokens), int(limit), eos_token_id))
        stamps = result.timestamps or [result.lifespan[1]]
        first.append(stamps[0] - began)
    seconds = time.perf_counter() - began
    return TokenRun(
        tokens, "continuous", seconds, first, busy_seconds=done_at, unfinished=unfinished
    )


def _next_results(manager: object, timeout: float) -> list:
    """The next result (waiting up to ``timeout`` for it) and every other one already queued.

    Results are drained without a request id: asking for one id returns None whenever another
    request's result is first in the queue.
    """
    first = manager.get_result(timeout=timeout)
    if first is None:
        return []
    polled = [first]
    while (result := manager.get_result(timeout=0)) is not None:
        polled.append(result)
    return polled
