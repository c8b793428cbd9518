"""Workload 3: sentence embeddings with the packaged MiniLM, against sentence-transformers."""

from __future__ import annotations

import numpy as np
import torch

from assets.documents.demo_data import BOILERPLATE, TOPICS
from benchmarks.common import Workload, best_of
from inference.engine.batching import padding_ratio
from inference.engine.device import make_runtime
from inference.text.embeddings import encode, mean_pool
from inference.text.encoder import SentenceEncoder, load_sentence_encoder, packaged_encoder_path

SENTENCES = [s for topic in TOPICS.values() for s in topic["sentences"]] + BOILERPLATE


def make_texts(encoder: SentenceEncoder, count: int, seed: int = 0) -> list[str]:
    """``count`` distinct texts of 10..300 tokens (uniform), made of the demo articles' sentences."""
    rng = np.random.default_rng(seed)
    texts = []
    for target in rng.integers(10, 301, count):
        words: list[str] = []
        while len(words) < target:
            words += str(rng.choice(SENTENCES)).split()
        ids = encoder.tokenizer(" ".join(words), add_special_tokens=False)["input_ids"][
            : target - 2
        ]
        texts.append(f"{len(texts)}: " + encoder.tokenizer.decode(ids))
    return texts


def unsorted_batches(
    encoder: SentenceEncoder, texts: list[str], size: int
) -> tuple[torch.Tensor, float]:
    """The same model in batches of ``size`` taken in input order, padded to each batch's longest."""
    out, lengths, batches = [], [], []
    with torch.inference_mode():
        for start in range(0, len(texts), size):
            batch = encoder.tokenizer(
                texts[start : start + size],
                padding=True,
                truncation=True,
                max_length=encoder.max_length,
                return_tensors="pt",
            )
            batch = {k: v.to(encoder.runtime.device) for k, v in batch.items()}
            hidden = encoder.model(**batch).last_hidden_state.float()
            out.append(mean_pool(hidden, batch["attention_mask"]).cpu())
            lengths += batch["attention_mask"].sum(1).tolist()
            batches.append(np.arange(start, start + len(batch["input_ids"])))
    return torch.cat(out), padding_ratio(lengths, batches)


def run(count: int, max_batch_tokens: int, max_batch_size: int, device: str = "cpu") -> Workload:
    from sentence_transformers import SentenceTransformer

    w = Workload("3 sentence embeddings")
    encoder = load_sentence_encoder(make_runtime(device, "fp32" if device == "cpu" else "auto"))
    texts = make_texts(encoder, count)
    lengths = [
        len(i)
        for i in encoder.tokenizer(texts, truncation=True, max_length=encoder.max_length)[
            "input_ids"
        ]
    ]
    w.facts.update(
        texts=count,
        mean_tokens=round(float(np.mean(lengths)), 1),
        max_batch_tokens=max_batch_tokens,
        max_batch_size=max_batch_size,
    )

    ours, ours_s = best_of(lambda: encode(encoder, texts, max_batch_tokens, max_batch_size), 1)
    st = SentenceTransformer(str(packaged_encoder_path()), device=device, local_files_only=True)
    if device != "cpu":
        st = st.to(encoder.runtime.dtype)
    theirs, st_s = best_of(lambda: st.encode(texts, convert_to_tensor=True), 1)
    (plain, plain_padding), plain_s = best_of(lambda: unsorted_batches(encoder, texts, 32), 1)

    w.facts.update(
        nightshift_padding=round(ours.padding, 4),
        unsorted_padding=round(plain_padding, 4),
        nightshift_model_calls=ours.model_calls,
        max_abs_difference_vs_sentence_transformers=float(
            (ours.vectors - theirs.cpu()).abs().max()
        ),
    )
    w.compare(
        "nightshift encode (length-bucketed, token budget)",
        "sentence-transformers encode (batch 32)",
        count / ours_s,
        count / st_s,
        "texts/s",
        True,
        1.0,
    )
    w.compare(
        "nightshift encode (length-bucketed, token budget)",
        "unsorted batches of 32",
        count / ours_s,
        count / plain_s,
        "texts/s",
        True,
        1.5,
    )
    w.compare(
        "length-sorted batches of 32 (sentence-transformers)",
        "unsorted batches of 32",
        count / st_s,
        count / plain_s,
        "texts/s",
        True,
        None,
        "same batch size: the gain from sorting alone",
    )
    return w
