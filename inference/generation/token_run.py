"""What a greedy decoding call returns, whichever strategy ran it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


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


def cut_tokens(tokens: list[int], limit: int, eos_token_id: int | list[int] | None) -> list[int]:
    """A request's new tokens cut to its own limit and after its first end-of-sequence token
    (any of them, where a generation config lists several)."""
    tokens = tokens[:limit]
    ends = set() if eos_token_id is None else set(np.atleast_1d(eos_token_id).tolist())
    stop = next((i for i, token in enumerate(tokens) if token in ends), None)
    return tokens if stop is None else tokens[: stop + 1]
