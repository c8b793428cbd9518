"""The cased CNN/DailyMail test articles from BUMP, FRANK and the cased stories
(evaluation.cnn_dailymail_cased)."""

from __future__ import annotations

import hashlib
import json

import pytest

from evaluation import cnn_dailymail_cased as cased
from evaluation import summaries as evaluation

CNN_URL = "http://web.archive.org/web/2015id_/http://www.cnn.com/2015/04/01/us/index.html"
MAIL_URL = "http://web.archive.org/web/2015id_/http://www.dailymail.co.uk/news/article-2.html"


def _bump(path, records):
    path.write_text(json.dumps(records))
    return path


def _record(index, article, reference, edited="x"):
    return {
        "id": 0,
        "article_id": index,
        "article": article,
        "reference_summary": reference,
        "edited_summary": edited,
    }


def test_bump_keeps_one_row_per_article_its_source_from_the_test_index(tmp_path):
    mail = "Council approves the plan. iPhone sales rose after it."
    first = _bump(
        tmp_path / "task1.json",
        [
            _record(5000, mail, "Council approves plan . Sales rose .", "one"),
            _record(5000, mail, "Council approves plan . Sales rose .", "two"),
            _record(12, "(CNN)It rained.", "It rained ."),
        ],
    )
    second = _bump(
        tmp_path / "task2.json", [_record(5000, mail, "Council approves plan . Sales rose .")]
    )
    out = tmp_path / "bump.csv"
    assert cased.main(["bump", str(out), str(first), str(second)]) == 0
    examples = evaluation.load_examples(out)
    assert [(e.doc_id, e.source) for e in examples] == [
        ("bump-test-12", "cnn"),
        ("bump-test-5000", "dailymail"),
    ]
    assert examples[1].reference == "Council approves plan .\nSales rose ."
    assert evaluation.article_sources(examples, None) == {
        "bump-test-12": "cnn",
        "bump-test-5000": "dailymail",
    }


def test_bump_refuses_one_index_with_two_texts(tmp_path):
    path = _bump(tmp_path / "t.json", [_record(5000, "A.", "a ."), _record(5000, "B.", "b .")])
    with pytest.raises(ValueError, match="article_id 5000"):
        cased.bump_rows([path])


def _frank(folder, url, article, reference):
    name = hashlib.sha1(url.encode()).hexdigest()
    record = {"url": url, "article": article, "bart_reference": reference, "hash": name}
    (folder / f"{name}.json").write_text(json.dumps(record))
    return name


def test_frank_rows_in_test_order_detokenised_without_the_excluded(tmp_path):
    urls = tmp_path / "all_test.txt"
    urls.write_text(f"{CNN_URL}\n{MAIL_URL}\n")
    folder = tmp_path / "frank"
    folder.mkdir()
    mail = _frank(
        folder,
        MAIL_URL,
        "The firm's £330million loan (Greece) was repaid.",
        "Greece 's £ 330million loan -LRB- IMF -RRB- is `` repaid '' . It was n't late .",
    )
    _frank(folder, CNN_URL, "(CNN)It rained.", "It rained .")
    (folder / "35933239.json").write_text("{}")  # an XSum article: not CNN/DailyMail
    out = tmp_path / "frank.csv"
    cased.write(cased.frank_rows(urls, folder, exclude=["(CNN)It  rained."]), out)
    examples = evaluation.load_examples(out)
    assert [(e.doc_id, e.source) for e in examples] == [(mail, "dailymail")]
    assert (
        examples[0].reference == "Greece's £330million loan (IMF) is \"repaid\" .\nIt wasn't late ."
    )


def test_frank_refuses_a_file_not_named_by_its_urls_sha1(tmp_path):
    urls = tmp_path / "all_test.txt"
    urls.write_text(f"{MAIL_URL}\n")
    folder = tmp_path / "frank"
    folder.mkdir()
    wrong = "0" * 40
    (folder / f"{wrong}.json").write_text(
        json.dumps({"url": MAIL_URL, "article": "A.", "bart_reference": "a ."})
    )
    with pytest.raises(ValueError, match=wrong):
        cased.frank_rows(urls, folder)


def _chunks(path, rows):
    import csv

    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=("article", "highlights", "id"))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_stories_pair_the_cased_text_with_the_chunks_highlights_as_prose(tmp_path):
    folder = tmp_path / "stories"
    folder.mkdir()
    story = (
        "-LRB- CNN -RRB- The firm 's # 330million loan was `` repaid . '' "
        "iPhone sales rose at 12am . Caption without a period ."
    )
    (folder / f"{'a' * 40}.story").write_text(story)
    chunks = _chunks(
        tmp_path / "chunks.csv",
        [
            {
                "article": '( cnn ) the firm \'s £ 330million loan was " repaid . " iphone sales '
                "rose at 12 am . caption without a period .",
                "highlights": "firm repays loan .\nsales rose .",
                "id": "a" * 40,
            },
            {"article": "not among the stories .", "highlights": "x .", "id": "b" * 40},
        ],
    )
    out = tmp_path / "cased.csv"
    assert cased.main(["stories", str(out), str(chunks), str(folder)]) == 0
    (example,) = evaluation.load_examples(out)
    assert example.doc_id == "a" * 40
    assert example.article == (
        '(CNN) The firm\'s £330million loan was "repaid." iPhone sales rose at 12am. '
        "Caption without a period."
    )
    assert example.reference == "firm repays loan.\nsales rose."
    # No source column: the URL list tells it, as for the chunks.
    assert example.source is None


def test_stories_refuse_a_story_that_is_not_the_chunks_article(tmp_path):
    folder = tmp_path / "stories"
    folder.mkdir()
    (folder / f"{'a' * 40}.story").write_text("An entirely different article about the weather .")
    chunks = _chunks(
        tmp_path / "chunks.csv",
        [
            {
                "article": "the council approved the budget on monday .",
                "highlights": "x .",
                "id": "a" * 40,
            }
        ],
    )
    with pytest.raises(ValueError, match=f"{'a' * 40}.story: shares"):
        cased.story_rows(chunks, folder)


def test_whole_writes_the_shipped_rows_and_the_same_rows_with_their_story(tmp_path):
    folder = tmp_path / "stories"
    folder.mkdir()
    (folder / f"{'a' * 40}.story").write_text(
        "Caption of the photo .\nThe mayor opened the bridge on Monday .\nTolls are free ."
    )
    (folder / f"{'c' * 40}.story").write_text("A story about something else entirely .")
    shipped = [
        {
            "article": "Caption of the photo The mayor opened the bridge on Monday. Tolls are free.",
            "highlights": "Mayor opens bridge.",
            "id": "a" * 40,
            "source": "dailymail",
        },
        {"article": "No story has this one.", "highlights": "x.", "id": "b" * 40, "source": "cnn"},
    ]
    source = tmp_path / "frank.csv"
    cased.write(shipped, source)
    whole, kept = tmp_path / "whole.csv", tmp_path / "kept.csv"
    assert cased.main(["whole", str(whole), str(kept), str(source), str(folder)]) == 0
    (as_shipped,) = evaluation.load_examples(kept)
    (from_story,) = evaluation.load_examples(whole)
    assert as_shipped.article == shipped[0]["article"]
    # The story's lines stay paragraphs, each ended by a period.
    assert from_story.article == (
        "Caption of the photo.\nThe mayor opened the bridge on Monday.\nTolls are free."
    )
    assert from_story.reference == as_shipped.reference == "Mayor opens bridge."
    assert from_story.source == "dailymail"
    # A story that does not hold the shipped article is refused, named.
    shipped[1]["id"] = "c" * 40
    with pytest.raises(ValueError, match=f"{'c' * 40}.story: holds"):
        cased.whole_rows(shipped, folder)


def test_paired_margins_count_each_article_once_per_source_and_form(tmp_path):
    from inference.engine.device import make_runtime
    from inference.text.encoder import load_sentence_encoder

    lead = "The council approved the new bridge on Monday. It will open in May. Tolls are free."
    rest = " Residents spoke at length about parking. The weather was mild. A dog barked twice."
    out = tmp_path / "tiny.csv"
    cased.write(
        [
            {
                "article": lead + rest,
                "highlights": "Council approves bridge .\nIt opens in May .",
                "id": f"a{i}",
                "source": "dailymail" if i % 2 else "cnn",
            }
            for i in range(4)
        ],
        out,
    )
    encoder = load_sentence_encoder(make_runtime("cpu", "fp32"))
    rows = evaluation.paired_margins(
        data=out, every=1, offsets=[0], cache=tmp_path, encoder=encoder
    )
    by = {r["dataset"]: r for r in rows}
    assert set(by) == {f"tiny {g} ({f})" for g in ("all", "cnn", "dailymail") for f in FORMS}
    for row in rows:
        assert row["wins"] + row["ties"] + row["losses"] == row["documents"]
        # The same article four times: every margin is the same, so its spread is nil.
        assert row["se"] == 0.0
    assert by["tiny all (plain)"]["documents"] == 4 and by["tiny cnn (plain)"]["documents"] == 2
    assert "| tiny dailymail (plain) |" in evaluation.margins_table(rows)


FORMS = ("tokenised", "plain")


def test_the_report_scores_the_sets_it_has_and_names_the_missing(tmp_path):
    sets = [evaluation.TEST_CASED, evaluation.TEST_FRANK]
    with pytest.raises(FileNotFoundError, match="cnn_dailymail_test_cased is not in"):
        evaluation.report(cache=tmp_path, datasets=sets)
    missing: list[str] = []
    assert evaluation.report(cache=tmp_path, datasets=sets, missing=missing) == []
    assert [m.split(" ")[0] for m in missing] == [s.name for s in sets]
    assert all("Get it with:" in m for m in missing)
