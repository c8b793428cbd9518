"""Abstractive summaries with a local Hugging Face checkpoint: greedy, length-bucketed batches.

Any seq2seq (``AutoModelForSeq2SeqLM``) or causal (``AutoModelForCausalLM``) checkpoint folder
works; which one is decided from its config's ``is_encoder_decoder``. Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from inference.batching import length_buckets, padding_ratio
from inference.device import Runtime
from inference.text import folder_fingerprint, offline_hub

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SEQ2SEQ_PROMPT = "summarize: {text}"
CAUSAL_PROMPT = "{text}\nTL;DR:"


class CheckpointError(ValueError):
    """The abstractive checkpoint is not configured, missing or unusable."""


@dataclass(frozen=True)
class Generator:
    """A loaded abstractive summariser."""

    tokenizer: PreTrainedTokenizerBase
    model: torch.nn.Module
    runtime: Runtime
    is_encoder_decoder: bool
    version: str


@dataclass
class Generated:
    """Generated texts, in input order, and the batches that produced them."""

    texts: list[str]
    batch_sizes: list[int] = field(default_factory=list)
    padding: float = 0.0


def checkpoint_version(path: str | Path) -> str:
    """``<folder name>@<content hash>`` of a checkpoint folder."""
    folder = Path(path)
    patterns = ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt")
    return f"{folder.name}@{folder_fingerprint(folder, patterns)}"


def check_checkpoint(path: str | Path | None) -> Path:
    """Returns the checkpoint folder, or raises CheckpointError saying what is wrong."""
    if not path:
        raise CheckpointError(
            "abstractive mode needs checkpoint_path: a local folder holding a Hugging Face "
            "seq2seq or causal LM checkpoint (config.json, weights, tokenizer)"
        )
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise CheckpointError(
            f"checkpoint_path {folder} is not a model folder: no config.json there"
        )
    return folder


def load_generator(path: str | Path | None, runtime: Runtime) -> Generator:
    """Loads a local checkpoint and its tokenizer, offline, in eval mode on the runtime's device.

    Args:
        path: the checkpoint folder.
        runtime: device and dtype to run on.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    folder = check_checkpoint(path)
    with offline_hub():
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        seq2seq = bool(config.is_encoder_decoder)
        # Decoder-only models continue the text on the right, so batches are padded on the left.
        tokenizer = AutoTokenizer.from_pretrained(
            folder, local_files_only=True, padding_side="right" if seq2seq else "left"
        )
        auto = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM
        model = auto.from_pretrained(folder, local_files_only=True, dtype=runtime.dtype)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise CheckpointError(f"tokenizer in {folder} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    model.to(runtime.device).eval()
    return Generator(tokenizer, model, runtime, seq2seq, checkpoint_version(folder))


def generate_summaries(
    generator: Generator,
    texts: Sequence[str],
    *,
    max_new_tokens: int,
    max_input_tokens: int,
    max_batch_tokens: int,
    max_batch_size: int,
    prompt: str | None = None,
    strategy: str = "static",
    decisions: dict[str, str] | None = None,
) -> Generated:
    """Summarises texts greedily in static batches of similar length, or another strategy.

    A batch's token budget counts the prompt and the tokens to be generated, since a causal
    model's sequence (and a seq2seq decoder's) grows by ``max_new_tokens``.

    Args:
        generator: a loaded checkpoint.
        texts: the documents.
        max_new_tokens: longest summary, in tokens.
        max_input_tokens: each document is cut to this many tokens before the prompt is built.
        max_batch_tokens: padded tokens (input + new) per generate call.
        max_batch_size: documents per generate call.
        prompt: a template with ``{text}``; default ``summarize: {text}`` for seq2seq and
            ``{text}\\nTL;DR:`` for causal models.
        strategy: ``static`` (above), or for causal models ``continuous`` or ``auto`` (see
            :func:`generate_tokens`); encoder-decoder models always run static.
        decisions: where ``auto`` keeps its measured choice between calls.
    """
    if not texts:
        return Generated([])
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy '{strategy}': expected one of {', '.join(STRATEGIES)}")
    template = prompt or (SEQ2SEQ_PROMPT if generator.is_encoder_decoder else CAUSAL_PROMPT)
    tokenizer = generator.tokenizer
    # The document is cut, not the prompt: a causal prompt ends in its cue ("TL;DR:").
    prompts = [template.replace("{text}", t) for t in _truncate(tokenizer, texts, max_input_tokens)]
    ids = tokenizer(prompts)["input_ids"]
    if strategy != "static" and not generator.is_encoder_decoder:
        run = generate_tokens(
            generator.model,
            ids,
            [max_new_tokens] * len(ids),
            strategy=strategy,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            max_batch_size=max_batch_size,
            max_batch_tokens=max_batch_tokens,
            decisions=decisions,
        )
        decoded = tokenizer.batch_decode(run.tokens, skip_special_tokens=True)
        # One entry: every document went through one generation call of the strategy.
        return Generated([t.strip() for t in decoded], [len(ids)])
    lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
    buckets = length_buckets(lengths + max_new_tokens, max_batch_tokens, max_batch_size)
    out: list[str] = [""] * len(texts)
    generated = Generated(out, padding=padding_ratio(lengths, buckets))
    device = generator.runtime.device
    with torch.inference_mode():
        for bucket in buckets:
            batch = tokenizer.pad({"input_ids": [ids[i] for i in bucket]}, return_tensors="pt")
            batch = {k: v.to(device) for k, v in batch.items()}
            tokens = generator.model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=tokenizer.pad_token_id,
            )
            if not generator.is_encoder_decoder:
                tokens = tokens[:, batch["input_ids"].shape[1] :]
            texts_out = tokenizer.batch_decode(tokens, skip_special_tokens=True)
            for index, text in zip(bucket, texts_out, strict=True):
                out[index] = text.strip()
            generated.batch_sizes.append(len(bucket))
    return generated


def _truncate(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_tokens: int
) -> list[str]:
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return [
        text
        if len(tokens) <= max_tokens
        else tokenizer.decode(tokens[:max_tokens], skip_special_tokens=True)
        for text, tokens in zip(texts, ids, strict=True)
    ]


# -- token-level strategies: static batches, continuous batching, and a measured choice -------------

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
    probe_requests: int = 16,
) -> TokenRun:
    """Greedy generation with a chosen strategy, or ``auto``: the one measured faster here.

    ``auto`` decides from measurement, not from what is usually true of a device: it runs two
    small sets of the real requests (same length mix), one with each strategy, keeps the one
    with more useful tokens per second, and runs the rest with it. The probe's outputs are
    part of the result, so measuring costs no repeated work. The choice is stored in
    ``decisions`` under the model's device type, so later calls with the same dict (one
    process scoring several partitions) reuse it. Encoder-decoder models always run static.

    Args:
        strategy: ``static``, ``continuous`` or ``auto``.
        decisions: where ``auto`` keeps its choice per device type (None: decide every call).
        probe_requests: requests per strategy in the probe.
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
    if known is not None or len(prompts) < 4 * probe_requests:
        run = runners[known or "static"](prompts, max_new_tokens)
        run.strategy = f"auto:{known or 'static'}"
        return run
    return _probe_then_run(prompts, max_new_tokens, runners, probe_requests, device, decisions)


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
