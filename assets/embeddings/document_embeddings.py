"""``document_embeddings``: a search vector for every document of the day.

A document is embedded in chunks of the encoder's window, pooled into one vector
(:func:`inference.text.embeddings.embed_documents`). Each document is embedded alone, so shards are
row ranges of the day; the encoder is taken where each shard runs (:class:`EmbeddingProgram`),
never sent from the step.
"""

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from dagster import AssetExecutionContext
from pydantic import Field

from assets.checkpointing import SpotSafeRun
from assets.documents.assets import documents
from assets.documents.quality import SCREEN_COLUMNS, screen_documents
from assets.documents.schemas import DATASET, DOCUMENTS_SCHEMA
from assets.embeddings.gates import (
    EMBEDDING_SUITES,
    SAMPLE_COLUMNS,
    embedding_check_results,
    embedding_observer,
)
from assets.embeddings.schemas import DIMENSION, EMBEDDINGS, EMBEDDINGS_SCHEMA
from assets.partitions import PartitionReport
from assets.runner import Day, Model, ScoringSpec, score, scoring_asset
from assets.text_models import ModelMetrics, encoder_key, sentence_encoder
from assets.text_workers import (
    LoadEncoder,
    ShardFigures,
    worker_batch_tokens,
    worker_metadata,
)
from inference.engine.shard_worker import ModelStep, worker_model
from inference.engine.work import Input, Output, Sizes, Work
from inference.generation.checkpoints import CheckpointError
from inference.text.chunks import Chunking
from inference.text.embeddings import embed_documents
from inference.text.encoder import SentenceEncoder
from inference.text.normalise import normalise_text
from resources.inference import InferenceResource
from resources.quality import QualityConfig, locate_in_landing
from resources.storage import DataStore, StorageResource

# The encoder's padded-token budget per call, as the metadata names it.
BUDGET = "model_batch_tokens"


class EmbeddingsConfig(QualityConfig):
    docs_per_chunk: int = Field(
        default=256,
        ge=1,
        description="Documents read and embedded at a time; within a chunk they are sorted "
        "into length buckets under the inference resource's token budget.",
    )
    docs_per_shard: int = Field(
        default=4096,
        ge=1,
        description="Documents per checkpointed shard (a retry redoes at most one).",
    )
    chunks_per_document: int = Field(
        default=Chunking().max_chunks,
        ge=1,
        description="Chunks of the encoder's window embedded per document (the rest of a "
        "longer document is not read); each costs about one short document's compute.",
    )
    chunk_decay: float = Field(
        default=Chunking().decay,
        gt=0.0,
        le=1.0,
        description="Weight of chunk i in the document's vector is chunk_decay ** i: the lead "
        "counts most.",
    )


def document_chunking(encoder: SentenceEncoder, config: EmbeddingsConfig) -> Chunking:
    """The configured chunking, in chunks of the encoder's whole window."""
    return Chunking(encoder.max_length, config.chunks_per_document, config.chunk_decay)


def vectors_version(encoder: SentenceEncoder, chunking: Chunking) -> str:
    """The encoder's version and the chunking: vectors pooled otherwise are not comparable."""
    return f"{encoder.version}/{chunking.describe()}"


def search_text(title: str | None, body: str | None) -> str:
    """What a document is embedded from: its title, then its body, as plain text (markup,
    entities and odd whitespace removed), so the first chunk holds the title and the lead."""
    parts = (normalise_text(title), normalise_text(body))
    return "\n\n".join(part for part in parts if part)


def document_texts(chunk: pa.RecordBatch) -> list[str]:
    """The search texts of a batch of documents (``title`` and ``body`` columns)."""
    titles, bodies = chunk.column("title").to_pylist(), chunk.column("body").to_pylist()
    return [search_text(t, b) for t, b in zip(titles, bodies, strict=True)]


def embed_batch(
    encoder: SentenceEncoder,
    chunking: Chunking,
    version: str,
    metrics: ModelMetrics,
    tokens: int,
    rows: int,
):
    """The model step for one batch of documents: (batch, texts) -> doc_id, embedding, version."""

    def transform(chunk: pa.RecordBatch, texts: list[str]) -> pa.RecordBatch:
        embedded = embed_documents(
            encoder, texts, chunking, max_batch_tokens=tokens, max_batch_size=rows
        )
        metrics.model_calls += embedded.model_calls
        flat = np.ascontiguousarray(embedded.vectors.numpy(), np.float32).reshape(-1)
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(flat), DIMENSION)
        versions = pa.repeat(pa.scalar(version, pa.string()), len(texts))
        return pa.record_batch([chunk["doc_id"], vectors, versions], schema=EMBEDDINGS_SCHEMA)

    return transform


@dataclass(frozen=True)
class EmbeddingProgram:
    """A shard's model step, built where it runs: the encoder (the step's own in its process,
    else loaded once per worker process on its device), model calls sized for that device,
    model figures in the shard's statistics."""

    key: str
    loader: LoadEncoder
    chunking: Chunking
    version: str
    max_batch_tokens: int | None
    max_batch_size: int

    def __call__(self, rows: pa.Table) -> ModelStep:
        encoder = worker_model(self.key, self.loader)
        tokens = worker_batch_tokens(self.max_batch_tokens, encoder.runtime.device)
        metrics = ModelMetrics()
        figures = ShardFigures(metrics, lambda: encoder.token_budget(tokens), BUDGET)
        observer = embedding_observer(self.version)

        def observe(scored: pa.RecordBatch, out: pa.Table, stats) -> None:
            observer(scored, out, stats)
            figures.record(stats)

        transform = embed_batch(
            encoder, self.chunking, self.version, metrics, tokens, self.max_batch_size
        )
        return ModelStep(transform, document_texts, observe=observe)


def load(store: DataStore, inference: InferenceResource, config: EmbeddingsConfig) -> Model:
    encoder = sentence_encoder(inference)
    chunking = document_chunking(encoder, config)
    width = chunking.dimension(encoder.model.config.hidden_size)
    if width != DIMENSION:
        raise CheckpointError(
            f"{encoder.version} with {chunking.describe()} writes {width}-dimensional vectors "
            f"but {EMBEDDINGS} holds {DIMENSION}: change the contract "
            "(assets/embeddings/schemas.py) with the model"
        )
    metadata = {"dimension": DIMENSION, "encoder_version": encoder.version}
    return Model(vectors_version(encoder, chunking), encoder_key(), encoder, metadata=metadata)


def day(run: SpotSafeRun, date: str, model: Model, config: EmbeddingsConfig, limit: float) -> Day:
    """One day's documents, screened as for summaries, embedded in checkpointed shards."""
    store, encoder, version, inference = run.store, model.value, model.version, run.inference
    program = EmbeddingProgram(
        model.key,
        LoadEncoder(inference.device, inference.precision),
        document_chunking(encoder, config),
        version,
        inference.max_batch_tokens,
        inference.max_batch_size,
    )
    work = Work(
        Input(
            store.iter_landing(DATASET, date, DOCUMENTS_SCHEMA, SCREEN_COLUMNS),
            quarantine=locate_in_landing(screen_documents(store, date).plan, store, DATASET, date),
        ),
        program,
        Output(EMBEDDINGS_SCHEMA, sample=tuple(SAMPLE_COLUMNS)),
        depends_on={"model": version},
        sizes=Sizes(batch_size=config.docs_per_chunk, shard_rows=config.docs_per_shard),
    )

    def checks(report: PartitionReport):
        return embedding_check_results(
            store,
            report,
            version=version,
            dimension=DIMENSION,
            sample_rows=config.check_sample_rows,
            seed=config.check_seed,
        )

    def metadata(report: PartitionReport) -> dict:
        # The model's figures came back with the shards, wherever they ran.
        budget = encoder.token_budget(inference.batch_tokens)
        return {**budget.describe(BUDGET), **worker_metadata(report.shards.stats, BUDGET)}

    return Day(work, checks, metadata)


DOCUMENT_EMBEDDINGS = ScoringSpec(EMBEDDINGS, DATASET, EMBEDDING_SUITES, load, day)


@scoring_asset(DOCUMENT_EMBEDDINGS, deps=[documents], group="embeddings")
def document_embeddings(
    context: AssetExecutionContext,
    config: EmbeddingsConfig,
    storage: StorageResource,
    inference: InferenceResource,
):
    """A 1,408-dimensional unit vector for every document published that day, for semantic
    search and related-article lookups: doc_id, embedding (float32, L2 norm 1, so a dot
    product is the cosine similarity) and the model_version that wrote it. A query is embedded
    the same way (`inference.text.embeddings.embed_documents` with the same chunking).

    Each document's title and body, normalised to plain text, are cut into chunks of the
    packaged all-MiniLM-L6-v2 sentence encoder's 256-token window at sentence ends; the first
    `chunks_per_document` chunks are embedded (mean pooling over tokens) and pooled into one
    384-dimensional vector, chunk i weighted `chunk_decay ** i`. Beside it come the document's
    words hashed into 1,024 signed buckets (`inference.text.lexical`), so names and numbers a query
    shares with its document count; the two parts weigh equally in a dot product. The model version names the encoder and the
    chunking: vectors of different model versions are not comparable. Blocking checks count, over every row, that
    each screened document has exactly one vector of the model's dimension, finite and of
    unit norm. Documents that cannot be embedded (no or repeated id, no text, not UTF-8, too
    long, published outside the day) go to `document_embeddings_quarantine` with a reason,
    exactly as for summaries; above the quarantine limit the day fails and nothing is published.
    """
    yield from score(context, DOCUMENT_EMBEDDINGS, config, storage, inference)
