"""Real news for the vector benchmarks: the committed sample of the News Category Dataset
(HuffPost headlines and their short descriptions; source, licence and sha256 in
``benchmarks/data/README.md``), embedded the way ``document_embeddings`` embeds a day.

Embedding thousands of documents takes minutes on a few cores, so the vectors can be kept in a
cache folder between runs, under a name that carries the texts' digest and the count.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np

CORPUS = Path(__file__).resolve().parent / "data" / "news_category_10k.jsonl.gz"
# The decompressed file is the source's file byte for byte (benchmarks/data/README.md).
CORPUS_SHA256 = "c50f756e92f00cd22b96869a042dc4089752b3883d34dc946c8002791bc82472"


class CorpusError(ValueError):
    """The committed sample is missing, altered or unreadable."""


def news_documents(path: Path = CORPUS) -> list[tuple[str, str]]:
    """Each distinct (headline, short description) of the sample, in the file's order.

    Raises:
        CorpusError: the file is missing, its content is not the recorded sample, or a line
            lacks a headline or a description.
    """
    if not path.exists():
        raise CorpusError(f"{path}: the news sample is missing (see benchmarks/data/README.md)")
    raw = gzip.decompress(path.read_bytes())
    digest = hashlib.sha256(raw).hexdigest()
    if path == CORPUS and digest != CORPUS_SHA256:
        raise CorpusError(f"{path}: sha256 {digest}, expected {CORPUS_SHA256}")
    seen: set[tuple[str, str]] = set()
    documents = []
    for number, line in enumerate(raw.decode().splitlines(), 1):
        record = json.loads(line)
        try:
            document = (record["headline"], record["short_description"])
        except KeyError as missing:
            raise CorpusError(f"{path}: line {number} has no {missing}") from None
        # A repeated story would tie with itself in every neighbour list.
        if document not in seen:
            seen.add(document)
            documents.append(document)
    return documents


def news_vectors(documents: list[tuple[str, str]], cache: Path | None = None) -> np.ndarray:
    """The documents' vectors as ``document_embeddings`` writes them (the asset's model step:
    title then body, the shipped MiniLM offline, its chunking), one row each, from ``cache``
    when an earlier run left them there."""
    digest = hashlib.sha256(json.dumps(documents).encode()).hexdigest()[:16]
    kept = cache / f"news-{len(documents)}-{digest}.npy" if cache is not None else None
    if kept is not None and kept.exists():
        return np.load(kept)
    matrix = _embedded(documents)
    if kept is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        np.save(kept, matrix)
    return matrix


def _embedded(documents: list[tuple[str, str]]) -> np.ndarray:
    from assets.embeddings.document_embeddings import EmbeddingsConfig, search_text
    from assets.text_models import sentence_encoder
    from evaluation.embeddings import asset_embeddings
    from resources.inference import InferenceResource

    inference = InferenceResource(device="cpu")
    texts = [search_text(title, body) for title, body in documents]
    return asset_embeddings(sentence_encoder(inference), inference, EmbeddingsConfig(), texts)
