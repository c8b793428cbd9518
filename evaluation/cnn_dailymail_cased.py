"""Cased CNN/DailyMail test articles with their highlights, from three public sources.

No copy of the cased test split fits the public-repository store (its files of 4 MiB and more
are dropped), but two factual-consistency benchmarks ship CNN/DailyMail test articles, cased,
with the reference highlights beside them, and one repository ships the cased articles alone:

- BUMP (Ma et al. 2023, github.com/dataminr-ai/BUMP, ``data/task1_dataset.json`` and
  ``task2_dataset.json``): whole articles and their highlights as plain prose, keyed by
  ``article_id``, an index into the test split, whose first 1,093 articles are CNN (the URL
  list has the 1,093 CNN URLs first). That index is the source: it agrees with the "(CNN)"
  dateline on every article.
- FRANK (Pagnoni et al. 2021, github.com/artidoro/frank, ``data/articles-wbertscore-json/``):
  one JSON file per article with its URL (whose sha1 is the file's name, checked here), the
  article as the summarisers read it (whole, as far as the stories below show, but in
  Daily Mail articles with caption and heading lines run into the next sentence without a
  period, so their sentences are fewer and longer) and the highlights in
  Stanford-tokenised cased form (``-LRB-``, `` 's``, `` .``), which :func:`detokenise` turns
  back into prose. The URL is the source.
- github.com/chihiro2101/cnndaily_tbga, ``stories/<sha1 of the URL>.story``: 11,133 of the
  11,490 test articles, whole, cased, Stanford-tokenised, a missing final period added to each
  line (as See et al.'s ``make_datafiles.py`` does before it lower-cases), and no highlights.
  :func:`story_rows` pairs each with the highlights of the same article in See et al.'s
  tokenised lower-case chunks (``evaluation.cnn_dailymail_bins``), checking that the two are
  the same text, and turns both into prose. ROUGE lower-cases, so the highlights' case does
  not change a score. The source is left to the URL list.

    python -m evaluation.cnn_dailymail_cased bump OUT.csv TASK1.json TASK2.json
    python -m evaluation.cnn_dailymail_cased frank OUT.csv ALL_TEST_URLS.txt DIR --exclude BUMP.csv
    python -m evaluation.cnn_dailymail_cased stories OUT.csv CHUNKS.csv DIR
    python -m evaluation.cnn_dailymail_cased whole OUT.csv SHIPPED_OUT.csv IN.csv DIR

write the CSV layout ``evaluation.summaries`` reads (article, highlights one per line, id,
source), articles in test-split order. FRANK articles that BUMP also holds are left out with
``--exclude``, so the two files share no article and their figures can be pooled. ``whole``
writes the rows of IN.csv that have a story twice: as they are (SHIPPED_OUT.csv) and with the
story as the article (OUT.csv), so that scoring both shows what the shipped text costs.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from statistics import median

from inference.text.segment import split_sentences

# The test split's URL list has its CNN articles first: 1,093 of 11,490.
CNN_TEST_ARTICLES = 1093
FIELDS = ("article", "highlights", "id", "source")
# One highlight ends with " ." (how the highlights are joined on one line in both sources).
_HIGHLIGHT_END = re.compile(r"(?<= \.)\s+")
_PTB = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}


def highlight_lines(text: str) -> str:
    """The highlights one per line: each ends with a detached period."""
    return "\n".join(line.strip() for line in _HIGHLIGHT_END.split(text.strip()) if line.strip())


def detokenise(text: str) -> str:
    """Stanford-tokenised prose back to plain: brackets, quotes, clitics and punctuation
    rejoined. The sentence-final " ." stays detached, as the highlights are published."""
    for token, char in _PTB.items():
        text = text.replace(token, char)
    text = re.sub(r"``\s*", '"', text)
    text = re.sub(r"\s*''", '"', text)
    text = re.sub(r"`\s*", "'", text)
    text = re.sub(r"([£$€])\s+(?=\d)", r"\1", text)
    text = re.sub(r"([(\[{])\s+", r"\1", text)
    text = re.sub(r"\s+([)\]}])", r"\1", text)
    text = re.sub(r"(?i)\s+(n't|'s|'re|'ve|'ll|'m|'d)\b", r"\1", text)
    text = re.sub(r"\s+([,;:!?%])", r"\1", text)
    return re.sub(r"\s{2,}", " ", text).strip()


def prose(text: str) -> str:
    """A Stanford-tokenised article as prose: :func:`detokenise`, then each sentence's final
    period rejoined and the tokeniser's ``#`` for a pound sign before an amount made ``£``
    again (its PTB escaping writes ``£50`` as ``# 50``)."""
    text = detokenise(text)
    text = re.sub(r"(?<=[^\s.])\s+\.(?=[\s\"')\]]|$)", ".", text)
    return re.sub(r"#\s*(?=\d)", "£", text)


def story_rows(chunks: Path, folder: Path, least_shared: float = 0.9) -> list[dict[str, str]]:
    """One row per article of ``chunks`` (a CSV of See et al.'s tokenised lower-case articles
    with their highlights, in test-split order) that ``folder`` holds a cased story of, named by
    its id; raises, naming the file, when a story's words are not mostly the chunk's."""
    with open(chunks, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    out = []
    for row in rows:
        if (story := _story(folder, row["id"])) is None:
            continue
        path, cased = story
        ours, theirs = _words(cased), _words(row["article"])
        shared = len(ours & theirs) / max(1, len(ours | theirs))
        if shared < least_shared:
            raise ValueError(
                f"{path}: shares {shared:.2f} of its words with article {row['id']} of {chunks}"
            )
        highlights = "\n".join(prose(line) for line in row["highlights"].splitlines())
        out.append(
            {"article": prose(cased), "highlights": highlights, "id": row["id"], "source": ""}
        )
    return out


def whole_rows(
    rows: Sequence[dict[str, str]], folder: Path, least_contained: float = 0.9
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The rows (FRANK's, say) that have a story in ``folder``, and the same rows with the
    story's whole text as their article: the same highlights, so two scores of them differ only
    in how the article was kept. A shipped article mostly not in its story is an error."""
    kept, whole = [], []
    for row in rows:
        if (story := _story(folder, row["id"])) is None:
            continue
        path, cased = story
        theirs = _words(row["article"])
        contained = len(theirs & _words(cased)) / max(1, len(theirs))
        if contained < least_contained:
            raise ValueError(f"{path}: holds {contained:.2f} of article {row['id']}'s text")
        kept.append(row)
        whole.append({**row, "article": prose(cased)})
    return kept, whole


def _story(folder: Path, article_id: str) -> tuple[Path, str] | None:
    """The story file named by the article's id and its text, or None when there is none."""
    path = folder / f"{article_id}.story"
    return (path, path.read_text(encoding="utf-8").strip()) if path.exists() else None


def shape(rows: Sequence[dict[str, str]]) -> dict[str, float]:
    """Medians of the articles' words, sentences (as the summariser splits them), words per
    sentence and longest sentence: how two keepings of the same articles differ."""
    counts = []
    for row in rows:
        lengths = [len(s.split()) for s in split_sentences(row["article"])] or [0]
        counts.append((sum(lengths), len(lengths), sum(lengths) / len(lengths), max(lengths)))
    names = ("words", "sentences", "words per sentence", "longest sentence")
    return {name: median(c[k] for c in counts) for k, name in enumerate(names)}


def _words(text: str, width: int = 8) -> set[str]:
    """The text's 8-character runs once everything but letters and digits is dropped (and the
    tokeniser's bracket names): the same for both tokenisations, "12am" and "12 am" alike."""
    letters = re.sub(r"[^a-z0-9]+", "", re.sub(r"-[lr][rsc]b-", " ", text.lower()))
    return {letters[i : i + width] for i in range(max(1, len(letters) - width + 1))}


def bump_rows(paths: Sequence[Path]) -> list[dict[str, str]]:
    """One row per distinct BUMP article (each is repeated once per edited summary)."""
    articles: dict[int, dict[str, str]] = {}
    for path in paths:
        for record in json.loads(path.read_text(encoding="utf-8")):
            index = int(record["article_id"])
            row = {
                "article": record["article"],
                "highlights": highlight_lines(record["reference_summary"]),
                "id": f"bump-test-{index}",
                "source": "cnn" if index < CNN_TEST_ARTICLES else "dailymail",
            }
            if articles.setdefault(index, row) != row:
                raise ValueError(f"{path}: article_id {index} has two different texts")
    return [articles[i] for i in sorted(articles)]


def frank_rows(urls: Path, folder: Path, exclude: Sequence[str] = ()) -> list[dict[str, str]]:
    """One row per FRANK CNN/DailyMail article (files named by a sha1), in test-split order,
    without those whose text starts as one of ``exclude`` does."""
    position = {
        hashlib.sha1(u.encode()).hexdigest(): i
        for i, u in enumerate(urls.read_text(encoding="utf-8").split())
    }
    skip = {_key(text) for text in exclude}
    rows = []
    for path in sorted(folder.glob("*.json")):
        if not re.fullmatch(r"[0-9a-f]{40}", path.stem):
            continue  # the XSum articles, named by their BBC id
        record = json.loads(path.read_text(encoding="utf-8"))
        url = record["url"]
        if hashlib.sha1(url.encode()).hexdigest() != path.stem or path.stem not in position:
            raise ValueError(f"{path}: its url {url} is not the test URL its name is the sha1 of")
        if _key(record["article"]) in skip:
            continue
        source = "dailymail" if "dailymail.co.uk" in url else "cnn" if "cnn.com" in url else ""
        if not source:
            raise ValueError(f"{path}: url {url} is neither CNN nor Daily Mail")
        reference = highlight_lines(detokenise(record["bart_reference"]))
        rows.append(
            {
                "article": record["article"],
                "highlights": reference,
                "id": path.stem,
                "source": source,
            }
        )
    return sorted(rows, key=lambda r: position[r["id"]])


def _key(article: str) -> str:
    """An article's first 400 characters, whitespace collapsed: enough to tell two apart."""
    return " ".join(article.split())[:400]


def write(rows: Sequence[dict[str, str]], out: Path) -> None:
    """The rows as the CSV ``evaluation.summaries`` reads."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def main(argv: Sequence[str]) -> int:
    if len(argv) >= 3 and argv[0] == "bump":
        rows = bump_rows([Path(p) for p in argv[2:]])
    elif len(argv) in (4, 6) and argv[0] == "frank":
        exclude = []
        if len(argv) == 6 and argv[4] == "--exclude":
            with open(argv[5], newline="", encoding="utf-8") as handle:
                exclude = [r["article"] for r in csv.DictReader(handle)]
        rows = frank_rows(Path(argv[2]), Path(argv[3]), exclude)
    elif len(argv) == 4 and argv[0] == "stories":
        rows = story_rows(Path(argv[2]), Path(argv[3]))
    elif len(argv) == 5 and argv[0] == "whole":
        with open(argv[3], newline="", encoding="utf-8") as handle:
            kept, rows = whole_rows(list(csv.DictReader(handle)), Path(argv[4]))
        write(kept, Path(argv[2]))
        for source in ("cnn", "dailymail"):
            pair = [[r for r in rs if r["source"] == source] for rs in (kept, rows)]
            if pair[0]:
                shipped, whole = shape(pair[0]), shape(pair[1])
                print(
                    f"{source}, {len(pair[0])} articles, median as shipped / whole: "
                    + ", ".join(f"{k} {shipped[k]:.1f} / {whole[k]:.1f}" for k in shipped)
                )
    else:
        print(__doc__, file=sys.stderr)
        return 2
    write(rows, Path(argv[1]))
    # Stories carry no source of their own: eval_summaries takes it from the URL list.
    counts = Counter(r["source"] or "source by URL list" for r in rows)
    print(f"{argv[1]}: {len(rows)} articles, {dict(counts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
