"""Abstractive summaries with a local Hugging Face checkpoint: greedy, length-bucketed batches.

Any seq2seq (``AutoModelForSeq2SeqLM``) or causal (``AutoModelForCausalLM``) checkpoint folder
works; which one is decided from its config's ``is_encoder_decoder``. Nothing is downloaded.
Causal models can also run with continuous batching or the measured ``auto`` choice
(``strategy=``, see ``inference.generation.decoding``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from inference.engine.batching import length_buckets, padding_ratio
from inference.engine.device import Runtime, to_device
from inference.generation.checkpoints import CheckpointError, safetensors_folder
from inference.generation.decoding import STRATEGIES, generate_tokens
from inference.generation.static_decoding import FirstStep, static_sizing
from inference.generation.token_run import cut_tokens
from inference.text.encoder import folder_fingerprint

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

SEQ2SEQ_PROMPT = "summarize: {text}"
CAUSAL_PROMPT = "{text}\nTL;DR:"


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
    """Generated texts, in input order, and the batches that produced them.

    ``first_token_seconds[i]``: when text i's first token was produced, counted from the start
    of the call, so a request waits for the batches run before its own (as a served request
    waits in the queue, which its time to first token counts too).
    ``tokens``: the new tokens the model produced for them all, each text's up to and including
    its end-of-sequence token (padding, the prompt and a seq2seq decoder's start token not
    counted), before the texts are decoded and cut to the summary's length cap.
    """

    texts: list[str]
    batch_sizes: list[int] = field(default_factory=list)
    padding: float = 0.0
    first_token_seconds: list[float] = field(default_factory=list)
    tokens: int = 0


def checkpoint_version(path: str | Path) -> str:
    """``<folder name>@<content hash>`` of a checkpoint folder."""
    folder = Path(path)
    patterns = ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt")
    return f"{folder.name}@{folder_fingerprint(folder, patterns)}"


def check_checkpoint(path: str | Path | None) -> Path:
    """Returns the checkpoint folder, or raises CheckpointError saying what is wrong.

    A folder whose weights are pickled only (``pytorch_model.bin``) is refused with how to
    convert it: weights load from safetensors only.
    """
    if not path:
        raise CheckpointError(
            "abstractive mode needs checkpoint_path: a local folder holding a Hugging Face "
            "seq2seq or causal LM checkpoint (config.json, weights, tokenizer)"
        )
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(
            f"checkpoint_path {folder} does not exist: no config.json or weights to load"
        )
    config = folder / "config.json"
    if not config.is_file():
        raise CheckpointError(
            f"checkpoint_path {folder} is not a model folder: no config.json there"
        )
    try:
        seq2seq = bool(json.loads(config.read_text()).get("is_encoder_decoder"))
    except (OSError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"checkpoint_path {folder}: unreadable config.json ({exc})") from exc
    auto = "AutoModelForSeq2SeqLM" if seq2seq else "AutoModelForCausalLM"
    return safetensors_folder(folder, auto)


def load_generator(path: str | Path | None, runtime: Runtime) -> Generator:
    """Loads a local checkpoint and its tokenizer, offline, in eval mode on the runtime's device.

    Args:
        path: the checkpoint folder.
        runtime: device and dtype to run on.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    folder = check_checkpoint(path)
    # A local folder and local_files_only: nothing is looked up on the hub.
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    seq2seq = bool(config.is_encoder_decoder)
    # Decoder-only models continue the text on the right, so batches are padded on the left.
    tokenizer = AutoTokenizer.from_pretrained(
        folder, local_files_only=True, padding_side="right" if seq2seq else "left"
    )
    auto = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM
    model = auto.from_pretrained(
        folder, local_files_only=True, use_safetensors=True, dtype=runtime.dtype
    )
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
    import torch
    from transformers import StoppingCriteriaList

    began = time.perf_counter()
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
        offset = time.perf_counter() - began  # the prompts built before the run
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
        first = [offset + t for t in run.first_token_seconds]
        # One entry: every document went through one generation call of the strategy.
        return Generated(
            [t.strip() for t in decoded],
            [len(ids)],
            first_token_seconds=first,
            tokens=run.useful_tokens,
        )
    lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
    buckets = length_buckets(lengths + max_new_tokens, max_batch_tokens, max_batch_size)
    out: list[str] = [""] * len(texts)
    first = [0.0] * len(texts)
    generated = Generated(out, padding=padding_ratio(lengths, buckets), first_token_seconds=first)
    device = generator.runtime.device
    # Shared with the causal strategies' static batches: halved on out-of-memory, kept.
    budget = static_sizing(generator.model, max_batch_tokens)
    # What ``generate`` stops a request at: its generation config's ids (several for some
    # checkpoints), else the tokenizer's.
    config = getattr(generator.model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    eos = tokenizer.eos_token_id if eos is None else eos

    def call(rows: np.ndarray) -> None:
        batch = tokenizer.pad({"input_ids": [ids[i] for i in rows]}, return_tensors="pt")
        batch = {k: to_device(v, device) for k, v in batch.items()}
        step = FirstStep()
        tokens = generator.model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            pad_token_id=tokenizer.pad_token_id,
            stopping_criteria=StoppingCriteriaList([step]),
        )
        # A causal model's rows start with the prompt, a seq2seq decoder's with its start token;
        # a row that finished before its batch is padded after its end-of-sequence token.
        if not generator.is_encoder_decoder:
            tokens = tokens[:, batch["input_ids"].shape[1] :]
        new = tokens[:, int(generator.is_encoder_decoder) :].tolist()
        generated.tokens += sum(len(cut_tokens(row, len(row), eos)) for row in new)
        texts_out = tokenizer.batch_decode(tokens, skip_special_tokens=True)
        first_at = (step.at or time.perf_counter()) - began
        for index, text in zip(rows, texts_out, strict=True):
            out[index] = text.strip()
            first[index] = first_at
        generated.batch_sizes.append(len(rows))

    with torch.inference_mode():
        for bucket in buckets:
            width = int(lengths[bucket].max()) + max_new_tokens
            for _ in budget.run(len(bucket), lambda a, b, rows=bucket: call(rows[a:b]), width):
                pass
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
