"""Workload 4: generation with a small random causal LM: continuous vs static batches vs auto."""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.common import Workload
from inference.generation.decoding import (
    TokenRun,
    generate_continuous,
    generate_static,
    generate_tokens,
)


def random_llama(layers: int, width: int, vocab: int = 1024, dtype: torch.dtype = torch.float32):
    """A randomly initialised Llama built in memory: nothing is downloaded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=max(1, width // 64),
        num_key_value_heads=max(1, width // 128),
        max_position_embeddings=1024,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(config).to(dtype).eval()


def make_requests(count: int, vocab: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """Prompts of 16..128 tokens and output lengths of 8..128 tokens, uniform."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, vocab, n).tolist() for n in rng.integers(16, 129, count)]
    return prompts, rng.integers(8, 129, count).tolist()


def run(
    count: int,
    layers: int,
    width: int,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    repeats: int = 2,
) -> Workload:
    w = Workload("4 generation")
    model = random_llama(layers, width, dtype=dtype).to(device)
    prompts, limits = make_requests(count, model.config.vocab_size)
    w.facts.update(
        requests=count,
        layers=layers,
        width=width,
        device=device,
        dtype=str(dtype),
        requested_tokens=sum(limits),
    )
    # The peer is static batches of 32 by definition. nightshift's strategies get the
    # concurrency that suits the device: a GPU keeps 256 requests in flight, a CPU gains
    # nothing past 32 (each decoding step already fills it).
    peer_kw = {"eos_token_id": None, "max_batch_size": 32, "max_batch_tokens": 32 * 256}
    in_flight = 32 if device == "cpu" else 256
    ours_kw = {**peer_kw, "max_batch_size": in_flight, "max_batch_tokens": in_flight * 256}
    w.facts["nightshift_requests_in_flight"] = in_flight
    generate_static(model, prompts[:4], [4] * 4, pad_token_id=0, **peer_kw)  # warm-up

    def cold_auto() -> TokenRun:
        return generate_tokens(model, prompts, limits, pad_token_id=0, decisions={}, **ours_kw)

    calls = {
        "static-32": lambda: generate_static(
            model, prompts, limits, pad_token_id=0, bucketed=False, **peer_kw
        ),
        "static bucketed": lambda: generate_static(
            model, prompts, limits, pad_token_id=0, **ours_kw
        ),
        "continuous": lambda: generate_continuous(model, prompts, limits, **ours_kw),
        "auto (first call: probes)": cold_auto,
    }
    # Interleaved rounds, best of each: on a shared machine the load drifts within minutes.
    runs: dict[str, TokenRun] = {}
    for _ in range(repeats):
        for name, call in calls.items():
            run = call()
            if name not in runs or run.seconds < runs[name].seconds:
                runs[name] = run
    # What the first call decided, as a process that scored a partition before would hold it.
    decided = runs["auto (first call: probes)"].strategy.removeprefix("auto:")
    decisions = {torch.device(device).type: decided}
    runs["auto (decided)"] = min(
        (
            generate_tokens(model, prompts, limits, pad_token_id=0, decisions=decisions, **ours_kw)
            for _ in range(repeats)
        ),
        key=lambda r: r.seconds,
    )
    reference = runs["static-32"].tokens
    for name, r in runs.items():
        w.facts[name] = {
            "strategy": r.strategy,
            "seconds": round(r.seconds, 2),
            "tokens_per_second": round(r.tokens_per_second, 1),
            **{k: round(v, 3) for k, v in r.first_token_percentiles().items()},
            "same_tokens_as_static_32": r.tokens == reference,
            **r.probe,
        }
    rate = {name: r.tokens_per_second for name, r in runs.items()}
    better = max(rate["static-32"], rate["continuous"])
    cuda = device.startswith("cuda")
    w.compare(
        "continuous batching",
        "static batches of 32",
        rate["continuous"],
        rate["static-32"],
        "tokens/s",
        True,
        2.0 if cuda else None,
        "target applies on CUDA" if not cuda else "",
    )
    w.compare(
        "static length-bucketed batches",
        "static batches of 32",
        rate["static bucketed"],
        rate["static-32"],
        "tokens/s",
        True,
        None,
    )
    for name in ("auto (first call: probes)", "auto (decided)"):
        w.compare(
            name,
            "better of continuous and static-32",
            rate[name],
            better,
            "tokens/s",
            True,
            1.0,
            _auto_note(runs[name]),
        )
    # What deciding costs: the first call against its chosen strategy run alone.
    chosen = runs["auto (first call: probes)"].strategy.removeprefix("auto:")
    alone = {"static": "static bucketed", "continuous": "continuous"}[chosen]
    w.compare(
        "auto (first call: probes)",
        f"{alone} alone (the strategy it chose)",
        rate["auto (first call: probes)"],
        rate[alone],
        "tokens/s",
        True,
        None,
        "the probe's cost",
    )
    w.compare(
        "continuous batching",
        "static batches of 32 (time to first token, p50)",
        runs["continuous"].first_token_percentiles()["ttft_p50_s"],
        runs["static-32"].first_token_percentiles()["ttft_p50_s"],
        "s",
        False,
        None,
    )
    return w


def _auto_note(run: TokenRun) -> str:
    """The decision and, for a call that probed, what each strategy measured and what it cost."""
    note = f"chose {run.strategy.removeprefix('auto:')}"
    if not run.probe:
        return note
    p = run.probe
    stopped = " (stopped early: clearly behind)" if p.get("continuous_stopped_early") else ""
    return (
        f"{note}; probe of {int(p['probe_requests'])} requests each: static "
        f"{p['static_tokens_per_second']:,.0f} tokens/s, continuous "
        f"{p['continuous_tokens_per_second']:,.0f}{stopped}; probe {p['probe_seconds']:.2f} s, "
        f"cost {p['probe_cost_seconds']:.2f} s over the winner"
    )
