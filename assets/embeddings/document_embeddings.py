"""``document_embeddings``: a search vector for every document of the day.

A document is embedded in chunks of the encoder's window, pooled into one vector
(:func:`inference.text.embeddings.embed_documents`). Each document is embedded alone, so shards are
row ranges of the day; the encoder is loaded where each shard runs (:class:`EmbeddingPredictor`,
once per process or Ray actor), never sent from the step. The pipeline is declared on the public
module (``nightshift``), over the documents landing asset it shares with the summaries.
"""

import numpy as np
import pyarrow as pa
from pydantic import Field

from assets.documents.assets import DOCUMENTS_INPUT, document_sizes
from assets.embeddings.gates import SAMPLE_COLUMNS, embedding_check_results, embedding_observer
from assets.embeddings.schemas import DIMENSION, EMBEDDINGS, EMBEDDINGS_SCHEMA
from assets.nightly import Checks, Output, Predictor, nightly
from inference.engine.adaptive import AdaptiveBatchSize
from inference.engine.device import make_runtime
from inference.engine.invariants import StreamStats
from inference.engine.metrics import BatchMetrics
from inference.generation.checkpoints import CheckpointError
from inference.text.chunks import Chunking
from inference.text.embeddings import embed_documents
from inference.text.encoder import SentenceEncoder, load_sentence_encoder
from inference.text.normalise import normalise_text
from inference.text.workers import (
    ModelMetrics,
    ShardFigures,
    worker_batch_tokens,
    worker_metadata,
)
from resources.quality import QualityConfig

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


def document_chunking(
    encoder: SentenceEncoder, config: "EmbeddingsConfig | EmbeddingPredictor"
) -> Chunking:
    """The configured chunking (the asset's config, or the predictor's settings from it), in
    chunks of the encoder's whole window."""
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


class EmbeddingPredictor(Predictor):
    """The packaged all-MiniLM-L6-v2 with the configured chunking: a batch of documents in, one
    unit vector each out, model calls under the device's token budget. Its version is the
    encoder's and the chunking's, known once the encoder is loaded, so the step loads it too
    (and checks its width against the contract before any document is read)."""

    chunks_per_document: int
    chunk_decay: float
    loaded_in_step = True

    def load(self, device: str) -> None:
        self.use(load_sentence_encoder(make_runtime(device, self.precision)))

    def use(self, encoder: SentenceEncoder) -> None:
        """Embeds with ``encoder``, already loaded.

        Raises:
            CheckpointError: its vectors under this chunking do not have the contract's width.
        """
        chunking = document_chunking(encoder, self)
        width = chunking.dimension(encoder.model.config.hidden_size)
        if width != DIMENSION:
            raise CheckpointError(
                f"{encoder.version} with {chunking.describe()} writes {width}-dimensional "
                f"vectors but {EMBEDDINGS} holds {DIMENSION}: change the contract "
                "(assets/embeddings/schemas.py) with the model"
            )
        self.encoder, self.chunking = encoder, chunking
        self.tokens = worker_batch_tokens(self.max_batch_tokens, encoder.runtime.device)
        self.metrics = ModelMetrics()
        self.figures = ShardFigures(self.metrics, self.budget, BUDGET)
        self.call_tokens = 0  # the last call's tokens, until measured

    def budget(self) -> AdaptiveBatchSize:
        return self.encoder.token_budget(self.tokens)

    def version(self) -> str:
        return vectors_version(self.encoder, self.chunking)

    def prepare(self, batch: pa.RecordBatch) -> list[str]:
        return document_texts(batch)

    def __call__(self, batch: pa.RecordBatch, texts: list[str]) -> dict[str, pa.Array]:
        embedded = embed_documents(
            self.encoder,
            texts,
            self.chunking,
            max_batch_tokens=self.tokens,
            max_batch_size=self.max_batch_size,
        )
        self.metrics.model_calls += embedded.model_calls
        self.call_tokens += embedded.tokens
        flat = np.ascontiguousarray(embedded.vectors.numpy(), np.float32).reshape(-1)
        return {"embedding": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIMENSION)}

    def measure(self, metrics: BatchMetrics) -> None:
        # The tokens the encoder read in the call just made (its chunks' attention masks):
        # the day's tokens / tokens_per_second and nightshift_tokens_total.
        metrics.tokens += self.call_tokens
        self.call_tokens = 0

    def record(self, stats: StreamStats) -> None:
        self.figures.record(stats)

    def describe(self, stats: StreamStats) -> dict:
        # The model's figures came back with the shards, wherever they ran.
        return {
            "dimension": DIMENSION,
            "encoder_version": self.encoder.version,
            **self.budget().describe(BUDGET),
            **worker_metadata(stats, BUDGET),
        }


DESCRIPTION = """A 1,408-dimensional unit vector for every document published that day, for semantic
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
exactly as for summaries; above the quarantine limit the day fails and nothing is published."""

# 06:00 UTC, last of the night: one encoder pass a document fits the hour before the 07:00
# deadline. Its job includes `documents`, the landing asset it shares with the summaries, so
# that a day of documents landing late or re-delivered gets its embeddings as well as its
# summaries.
PIPELINE = nightly(
    EMBEDDINGS,
    EmbeddingPredictor,
    DOCUMENTS_INPUT,
    Output(
        pa.schema([EMBEDDINGS_SCHEMA.field("embedding")]),
        observe=embedding_observer,
        sample=SAMPLE_COLUMNS,
    ),
    Checks(suite="suites/document_embeddings.json", results=embedding_check_results),
    hour_utc=6,
    description=DESCRIPTION,
    group="embeddings",
    config=EmbeddingsConfig,
    sizes=document_sizes,
)
document_embeddings = PIPELINE.scoring_asset
