"""Landed days of documents (given bodies, or demo ones with crafted ones beside them), shared by
the summaries, embeddings and Ray test modules."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from assets.documents.demo_data import generate_day
from assets.documents.schemas import DOCUMENTS_SCHEMA

# Crafted documents beside the generated ones: an identical pair, a near and a far one, and one
# with no text at all, which cannot be embedded.
CRAFTED = {
    "same-1": ("Harbour strike ends", "Dock workers returned to work after a week-long strike."),
    "same-2": ("Harbour strike ends", "Dock workers returned to work after a week-long strike."),
    "cat": ("Cat naps", "The cat slept all afternoon on the warm windowsill."),
    "kitten": ("Kitten rests", "A small kitten dozed in the sun by the window."),
    "rates": ("Rates rise", "The central bank raised interest rates by half a point."),
    "blank": ("", "   "),
}


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


def land_crafted_documents(store, date: str) -> list[str]:
    """Lands ``date``'s demo documents (scale 0.02) with :data:`CRAFTED` beside them, at noon.

    Returns:
        Every landed doc_id, the generated ones first.
    """
    generate_day(store, date, scale=0.02)
    generated = store.read_landing("documents", date, DOCUMENTS_SCHEMA)
    noon = int(datetime.fromisoformat(date).replace(tzinfo=UTC).timestamp() * 1e6) + 43_200_000_000
    crafted = pa.table(
        {
            "doc_id": list(CRAFTED),
            "published_at": pa.array([noon] * len(CRAFTED), pa.timestamp("us", tz="UTC")),
            "title": [title for title, _ in CRAFTED.values()],
            "body": [body for _, body in CRAFTED.values()],
        },
        schema=DOCUMENTS_SCHEMA,
    )
    store.write_landing("documents", date, pa.concat_tables([generated, crafted]))
    return generated["doc_id"].to_pylist() + list(CRAFTED)
