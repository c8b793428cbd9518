"""Link targets never reach a summary: normalise_text drops them, and the summaries pipeline publishes none."""

from __future__ import annotations

import pyarrow as pa
import pytest
from dagster import materialize

from assets.documents.assets import documents
from assets.documents.schemas import DOCUMENTS_SCHEMA
from assets.summaries.digest import daily_digest
from assets.summaries.document_summaries import document_summaries
from inference.text.normalise import normalise_text
from inference.text.segment import split_sentences

DAY = "2026-03-02"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("Rates held. [Read more](javascript:alert(1))", "Rates held. Read more"),
        ('See [the report](https://example.com/a_(b) "Report") now.', "See the report now."),
        (
            "Chart: ![a bar chart](data:image/png;base64,iVBORw0KGgo=) below.",
            "Chart: a bar chart below.",
        ),
        (
            "Mail <https://example.com/x> or <javascript:alert(1)> us.",
            "Mail https://example.com/x or us.",
        ),
        ("Click javascript:alert(document.cookie) here.", "Click here."),
        ("Click JAVA\u200bSCRIPT:alert(1) here.", "Click here."),
        ("Click &#106;avascript:alert(1) here.", "Click here."),
        ("Open vbscript:msgbox(1) or data:text/html,<b>x</b> now.", "Open or now."),
        ('<p>Hi <a href="javascript:alert(1)">there</a>.</p>', "Hi there."),
        ("<p>[more](javascript:alert(1)) words</p>", "more words"),
        # Prose that only looks like a scheme or a link stays as written.
        ("JavaScript: a language. The data: 5 rows.", "JavaScript: a language. The data: 5 rows."),
        ("f(x) is [not a link] (really).", "f(x) is [not a link] (really)."),
        ("Visit https://example.com/page today.", "Visit https://example.com/page today."),
    ],
)
def test_normalise_drops_link_targets_and_keeps_their_text(body: str, expected: str) -> None:
    assert normalise_text(body) == expected


# Every sentence carries a script URL in one of the forms a landed body has it, so whichever
# sentences a summary picks, a target would show if normalising let one through.
LINKED_BODIES = {
    "markdown": (
        "The city council approved the new budget on Monday [Read more](javascript:alert(1)). "
        "Spending on parks rises by a tenth [details](javascript:alert('parks')). "
        "Road repairs get the largest share of the increase [more](JavaScript:void(0))."
    ),
    "autolink": (
        "Rail operators announced a timetable change for the spring <javascript:alert(2)>. "
        "Trains will run every ten minutes at peak hours <javascript:alert(3)>. "
        "Night services are extended on weekends <javascript:alert(4)>."
    ),
    "raw": (
        "The museum opens a new wing for modern art javascript:alert(5) this week. "
        "Tickets are free for students javascript:alert(6) until June. "
        "Guided tours start every hour javascript:alert(7) from the main hall."
    ),
    "html": (
        "<article><p>Farmers expect a record harvest "
        '<a href="javascript:alert(8)">this autumn</a>.</p>'
        '<p>Rain came at the right time <a href="javascript:alert(9)">for wheat</a>.</p>'
        "<p>Prices may fall as supply grows "
        '<a href="&#106;avascript:alert(10)">across the region</a>.</p></article>'
    ),
    "entities": (
        "Hospitals hired more nurses this year &#106;avascript:alert(11) than last. "
        "Waiting times fell in most regions &#x6a;avascript:alert(12) by spring. "
        "The health minister praised the staff [thanks](&#106;avascript:alert(13))."
    ),
    "image": (
        "The bridge reopened after two years of work ![photo](data:text/html,<script>x</script>). "
        "Cyclists now have a lane of their own ![map](javascript:alert(14)). "
        "Traffic on the old road has already halved [report](vbscript:msgbox(15))."
    ),
}


def _land(store) -> None:
    rows = len(LINKED_BODIES)
    store.write_landing(
        "documents",
        DAY,
        pa.table(
            {
                "doc_id": list(LINKED_BODIES),
                "published_at": pa.array(
                    [1_772_409_600_000_000 + i for i in range(rows)], pa.timestamp("us", tz="UTC")
                ),
                "title": [f"News {name}" for name in LINKED_BODIES],
                "body": list(LINKED_BODIES.values()),
            },
            schema=DOCUMENTS_SCHEMA,
        ),
    )


def _unsafe(value: object) -> bool:
    text = str(value).lower()
    return any(s in text for s in ("javascript:", "vbscript:", "data:text", "alert(", "msgbox("))


def test_published_summaries_and_digest_carry_no_script_urls(store, resources, instance) -> None:
    _land(store)
    result = materialize(
        [documents, document_summaries, daily_digest],
        partition_key=DAY,
        resources=resources,
        instance=instance,
    )
    assert result.success
    summaries = store.read_output("document_summaries", DAY).to_pylist()
    assert sorted(r["doc_id"] for r in summaries) == sorted(LINKED_BODIES)
    for row in summaries:
        assert row["summary"].strip(), row
        assert not any(_unsafe(v) for v in row.values()), row
    digest = store.read_output("daily_digest", DAY).to_pylist()
    assert digest and sorted(d for t in digest for d in t["doc_ids"]) == sorted(LINKED_BODIES)
    for topic in digest:
        assert topic["summary"].strip() and topic["label"].strip(), topic
        assert not any(_unsafe(v) for v in topic.values()), topic
    # Each summary is sentences of its body as normalised: the link text stays, the target went.
    for row in summaries:
        body = split_sentences(LINKED_BODIES[row["doc_id"]])
        assert set(split_sentences(row["summary"])) <= set(body), row
