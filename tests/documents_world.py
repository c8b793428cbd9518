"""A landed day of documents with given bodies, shared by the summaries test modules."""

from __future__ import annotations

import pyarrow as pa

from assets.summaries.documents import DOCUMENTS_SCHEMA


def land_documents(store, date: str, bodies: dict[str, str]) -> None:
    """Lands ``bodies`` (doc_id -> body) as the documents of ``date``, one second apart."""
    store.write_landing(
        "documents",
        date,
        pa.table(
            {
                "doc_id": list(bodies),
                "published_at": pa.array(
                    [1_772_409_600_000_000 + i for i in range(len(bodies))],
                    pa.timestamp("us", tz="UTC"),
                ),
                "title": [f"Title {name}" for name in bodies],
                "body": list(bodies.values()),
            },
            schema=DOCUMENTS_SCHEMA,
        ),
    )
