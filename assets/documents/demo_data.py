"""Demo news for the documents dataset: a day's articles on a handful of topics.

Each article belongs to one topic and is composed from that topic's sentence templates (in
:mod:`assets.documents.news_corpus`), filled with a few entities chosen once per article (one
company, one team, one city), plus some boilerplate lines any newsroom adds. Topics differ in
vocabulary, so clustering can recover them, and the lead sentences carry the story, so an
extractive summary has something to find.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from assets.documents.news_corpus import BOILERPLATE, FILL, SOURCES, TOPICS, WEEKDAYS
from assets.documents.schemas import DATASET, DOCUMENTS_SCHEMA
from resources.storage import DataStore

DOCUMENTS_PER_DAY = 500


def generate_day(store: DataStore, date: str, scale: float = 1.0, seed: int = 0) -> dict[str, int]:
    """Writes one day of demo articles to ``landing/documents/date=D/``.

    Args:
        store: where to write.
        date: the day, ``YYYY-MM-DD``.
        scale: 1.0 writes about 500 articles.
        seed: with ``date``, fixes every random choice: same arguments, same bytes.

    Returns:
        ``{"documents": rows written}``.
    """
    rng = np.random.default_rng([seed, int(date.replace("-", ""))])
    count = max(1, round(DOCUMENTS_PER_DAY * scale))
    # Each day news concentrates on a few topics, in changing proportions.
    names = sorted(TOPICS)
    active = rng.choice(names, size=int(rng.integers(4, len(names) + 1)), replace=False)
    weights = rng.dirichlet(np.full(len(active), 2.0))
    topics = rng.choice(active, size=count, p=weights)
    midnight = datetime.fromisoformat(date).replace(tzinfo=UTC)
    seconds = np.sort(rng.integers(0, 86_400_000_000, size=count))
    rows = [_article(rng, str(topic)) for topic in topics]
    table = pa.table(
        {
            "doc_id": [f"doc-{date.replace('-', '')}-{i:05d}" for i in range(count)],
            "published_at": pa.array(
                [int(midnight.timestamp() * 1_000_000) + int(s) for s in seconds],
                type=pa.timestamp("us", tz="UTC"),
            ),
            "title": [title for title, _ in rows],
            "body": [body for _, body in rows],
        },
        schema=DOCUMENTS_SCHEMA,
    )
    store.write_landing(DATASET, date, table, on_time=True)
    return {"documents": table.num_rows}


def demo_articles(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """``count`` demo articles as (title, body), topics drawn evenly: text to embed outside a
    day's landing (the serving benchmark, the vector search tests)."""
    rng = np.random.default_rng(seed)
    return [_article(rng, str(topic)) for topic in rng.choice(sorted(TOPICS), size=count)]


def _article(rng: np.random.Generator, topic: str) -> tuple[str, str]:
    spec = TOPICS[topic]
    slots = {name: str(rng.choice(values)) for name, values in FILL.items()}
    slots["team2"] = str(rng.choice([t for t in FILL["team"] if t != slots["team"]]))
    # Lengths are skewed like real news: many short items, a tail of long features.
    length = int(np.clip(round(rng.lognormal(np.log(13), 0.55)), 5, 40))
    templates = spec["sentences"]
    # Walk the templates in shuffled rounds, so a sentence repeats only in long articles.
    rounds = length // len(templates) + 1
    order = np.concatenate([rng.permutation(len(templates)) for _ in range(rounds)])
    sentences = []
    for position in range(length):
        if position > 1 and rng.random() < 0.12:
            sentences.append(str(rng.choice(BOILERPLATE)))
            continue
        sentence = _fill(templates[order[position]], slots, rng)
        if sentence.endswith(".") and rng.random() < 0.3:
            template = str(rng.choice(spec["sources"] + SOURCES))
            source = _fill(template, slots, rng)
            if template[0].islower():
                source = source[0].lower() + source[1:]
            sentence = f"{sentence[:-1]}, {source}."
        sentences.append(sentence)
    paragraphs, start = [], 0
    while start < length:
        size = int(rng.integers(2, 6))
        paragraphs.append(" ".join(sentences[start : start + size]))
        start += size
    title = _fill(str(rng.choice(spec["titles"])), slots, rng)
    return title, "\n\n".join(paragraphs)


def _fill(template: str, slots: dict[str, str], rng: np.random.Generator) -> str:
    values = {
        **slots,
        "pct": f"{rng.uniform(0.2, 9.5):.1f}",
        "num": str(int(rng.integers(2, 120))),
        "temp": str(int(rng.integers(85, 112))),
        "score": f"{int(rng.integers(2, 6))}-{int(rng.integers(0, 2))}",
        "weekday": str(rng.choice(WEEKDAYS)),
    }
    text = template.format(**values)
    return text[0].upper() + text[1:]
