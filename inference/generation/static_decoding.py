"""Static batches: requests in length-bucketed batches (or arrival order), each batch run by
``model.generate`` until its longest request is done, under a size that backs off on
out-of-memory."""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from inference.engine.adaptive import AdaptiveBatchSize, BatchSizes
from inference.engine.batching import length_buckets
from inference.engine.device import to_device
from inference.generation.token_run import TokenRun, cut_tokens

if TYPE_CHECKING:
    import torch


class FirstStep:
    """A stopping criterion that never stops: it notes when a batch's first token exists."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        import torch

        if self.at is None:
            self.at = time.perf_counter()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


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
    import torch
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
        step = FirstStep()
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
            tokens[i] = cut_tokens(new[row], int(limits[i]), eos_token_id)
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
