"""Summaries on real news against Lead-3: ROUGE-1/2/Lsum F1 (rouge-score, Porter stemming).

The data is CNN/DailyMail (human-written highlights as references), in two forms: plain
(cased, as published) and tokenised lower-case (Penn-Treebank-style tokens, `` . `` between
sentences, ``-lrb-`` brackets: the form many corpora ship). Five sets (:data:`DATASETS`): the
first 1,000 validation articles, all CNN, cased, whose tokenised form is made here by
:func:`ptb_tokenise`; 4,368 later validation articles, 4,148 of them Daily Mail, and 4,490 test
articles, 1,093 of them CNN, that exist here only in See et al.'s tokenised form
(:mod:`evaluation.cnn_dailymail_bins`), so they are scored in that form alone; and two sets of
cased test articles, mostly Daily Mail, from the BUMP and FRANK annotation benchmarks
(:mod:`evaluation.cnn_dailymail_cased`), both forms. The trained sentence scorer
(:mod:`evaluation.train_ranker`) learns from other articles: training chunks and the validation
articles outside these samples. Articles are drawn every k-th across a file, not the first N: the
ranker is tuned on such samples (``--tune``, each set's ``tuning`` offsets) and reported on
three disjoint ones pooled (offsets k/4, k/2, 3k/4). Each article's source, CNN or Daily Mail,
is read from the URL its id is the sha1 of (the published URL lists), else from its dateline;
the tables report the sources apart.

The articles are the publishers' copyright, so they are not in this repository: the files live
in a git-ignored cache (``.nightshift/eval/``) checked against their sha256, and
:func:`dataset_path` says how to get one that is missing.

    HF_HUB_OFFLINE=1 nice .venv/bin/python -m evaluation.summaries            # report
    HF_HUB_OFFLINE=1 nice .venv/bin/python -m evaluation.summaries --tune     # the grid
    ... -m evaluation.summaries --dataset cnn_dailymail_validation_chunks    # one set

``nightshift`` is the asset's own code path (``inference.text.text``: normalise, split, embed with
the packaged MiniLM, rank, cap) with the asset's default config; embeddings are cached on disk
between runs, keyed by the encoder version.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import itertools
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from evaluation.tables import metric_table
from inference.engine.device import make_runtime
from inference.text.embeddings import encode
from inference.text.encoder import SentenceEncoder, load_sentence_encoder
from inference.text.rank import RankerSettings, encoder_can_read
from inference.text.segment import ABBREVIATIONS, LengthCap, split_sentences
from inference.text.text import summarise_sentences

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".nightshift" / "eval"
METRICS = ("rouge1", "rouge2", "rougeLsum")
# Every k-th article: the tuning sample starts at 0, the reported ones at k/4, k/2 and 3k/4.
EVERY = 20
SOURCES = ("cnn", "dailymail")


@dataclass(frozen=True)
class Dataset:
    """A summarisation set kept outside the repository, and how to get it."""

    name: str
    file: str
    sha256: str
    source: str
    licence: str
    how_to_get: str
    # Every k-th article of this file makes a sample (offset 0 tunes, k/4, k/2, 3k/4 report).
    every: int = EVERY
    # The samples the ranker is tuned on: offsets of every k-th, none of them reported.
    tuning: tuple[int, ...] = (0,)
    # The forms its articles can be scored in: "plain" needs the cased text, from which the
    # tokenised form is made; a file that ships only the tokenised form has only that.
    forms: tuple[str, ...] = ("tokenised", "plain")
    # The URL list its ids are the sha1s of (a Dataset of the cache), if any.
    urls: str | None = "cnn_dailymail_validation_urls"


CNN_DAILYMAIL = Dataset(
    name="cnn_dailymail_validation_1000",
    file="cnn_dailymail_validation_1000.csv",
    sha256="fa0a78975e902c7e5bd59506bc5508f848add73bff87fef68670e934a742de67",
    source="CNN/DailyMail 3.0.0 validation[:1000] (article, highlights, id) as committed in "
    "github.com/hillaryke/rag-optimization-cnn-dailymail, commit "
    "03d05440507618d6bec073b46543696e5a47df20, data/collection/"
    "cnn_dailymail_validation_subset.csv (4,090,016 bytes)",
    licence="articles and highlights: copyright CNN and the Daily Mail, distributed for "
    "research (Hermann et al. 2015; See et al. 2017); the repository's MIT licence covers its "
    "code, not the articles. Not committed here.",
    how_to_get="git clone https://github.com/hillaryke/rag-optimization-cnn-dailymail && "
    "git -C rag-optimization-cnn-dailymail show 03d05440507618d6bec073b46543696e5a47df20:"
    "data/collection/cnn_dailymail_validation_subset.csv > "
    ".nightshift/eval/cnn_dailymail_validation_1000.csv",
)


_CHUNKS_REPO = "github.com/habiburrahmankhan/Abstractive_text_summarization"
_CHUNKS_COMMIT = "a7ba0507c900a18c6be0d52cc016066fa7cfa6b3"
_CHUNKS = {  # name: (first position in the validation URL list, bytes, sha256)
    "val_001": (1000, 3738842, "c1f01a2e94f2925240ce9c76a2b3fe03dcf2f0e6a185e457e9b786927f8c1b5e"),
    "val_002": (2000, 3360204, "d6560c61c3cd793317fa6b0055afdbee0672453568c6c32f07b74c079e7ae6c0"),
    "val_003": (3000, 3501238, "a520b9997f5acbf8ac3d49035cc56c016f5bdb730584881cd3da15ab52b1b5d3"),
    "val_004": (4000, 3821122, "8331a1488e96d00107c3043e5c39c3f0a96d0ad85590f46fea5f273d029bb19a"),
    "val_013": (13000, 1784208, "344806e405d83a933fce335fa001d50d12a935822cba2cd9ab620840d3386190"),
}

_CHUNKS_LICENCE = (
    "articles and highlights: copyright CNN and the Daily Mail, distributed for research "
    "(Hermann et al. 2015; See et al. 2017); the repository states no licence. Not committed here."
)


def _chunks_source(chunks: dict[str, tuple[int, int, str]]) -> str:
    """Where a set of See et al.'s chunk files comes from, with each file's size and digest."""
    files = "; ".join(
        f"{n}.bin {size:,} bytes sha256 {digest}" for n, (_, size, digest) in chunks.items()
    )
    return (
        f"the chunks finished_files/chunked/{{{','.join(chunks)}}}.bin of {_CHUNKS_REPO}, commit "
        f"{_CHUNKS_COMMIT}, path chunked/ ({files}), converted by evaluation.cnn_dailymail_bins"
    )


def _chunks_how_to_get(chunks: dict[str, tuple[int, int, str]], csv: str, urls: str) -> str:
    """The commands that fetch a set's chunk files and convert them to ``csv``."""
    shows = " && ".join(
        f"git -C chunks show {_CHUNKS_COMMIT}:chunked/{n}.bin > .nightshift/eval/chunks/{n}.bin"
        for n in chunks
    )
    parts = " ".join(
        f".nightshift/eval/chunks/{n}.bin:{first}" for n, (first, _, _) in chunks.items()
    )
    return (
        f"git clone https://{_CHUNKS_REPO} chunks && mkdir -p .nightshift/eval/chunks && {shows} "
        f"&& python -m evaluation.cnn_dailymail_bins .nightshift/eval/{csv} "
        f".nightshift/eval/{urls} {parts}"
    )


VALIDATION_CHUNKS = Dataset(
    name="cnn_dailymail_validation_chunks",
    file="cnn_dailymail_validation_chunks_tokenised.csv",
    sha256="ef4b3bd009c1ff6ac0f9dfedbcb9208750141d52f7a322b1c29ac794f77e63f8",
    source="CNN/DailyMail validation articles 1,000-4,999 and 13,000-13,367 (4,148 Daily Mail, "
    "220 CNN), in See et al.'s tokenised lower-case form, from " + _chunks_source(_CHUNKS),
    licence=_CHUNKS_LICENCE,
    how_to_get=_chunks_how_to_get(
        _CHUNKS, "cnn_dailymail_validation_chunks_tokenised.csv", "cnn_dailymail_all_val_urls.txt"
    ),
    every=80,
    # Five tuning samples of about 55 (the CNN file's single one is 50 articles).
    tuning=(0, 10, 30, 50, 70),
    forms=("tokenised",),
)


VALIDATION_URLS = Dataset(
    name="cnn_dailymail_validation_urls",
    file="cnn_dailymail_all_val_urls.txt",
    sha256="81887e982b045083409c6ee838aede8ff4b97291605bcfb21bffc456a16991db",
    source="the 13,368 validation URLs (the ids are their sha1) as committed in "
    "github.com/abisee/cnn-dailymail, commit b15ad0a2db0d407a84b8ca9b5731e1f1c4bd24b9, "
    "url_lists/all_val.txt (2,433,674 bytes)",
    licence="MIT (Abigail See), a list of URLs; kept in the cache beside the articles",
    how_to_get="git clone https://github.com/abisee/cnn-dailymail && "
    "git -C cnn-dailymail show b15ad0a2db0d407a84b8ca9b5731e1f1c4bd24b9:url_lists/all_val.txt "
    "> .nightshift/eval/cnn_dailymail_all_val_urls.txt",
    urls=None,
)

_BUMP_REPO, _BUMP_COMMIT = "github.com/dataminr-ai/BUMP", "86327f14b9e0c16a364a3793b8a622dc703d22fd"
_FRANK_REPO, _FRANK_COMMIT = "github.com/artidoro/frank", "5860706bda0641136d10d27ead52c5f6ae79630e"
_CASED_LICENCE = (
    "articles and highlights: copyright CNN and the Daily Mail, distributed for research "
    "(Hermann et al. 2015); the repository's MIT licence covers its annotations, not the "
    "articles. Not committed here."
)

TEST_BUMP = Dataset(
    name="cnn_dailymail_test_bump",
    file="cnn_dailymail_test_bump.csv",
    sha256="30a6616a00101cf2abe1c0058dc997359b23347027695bef35fe4de9fd88030f",
    source="198 CNN/DailyMail 3.0.0 test articles (176 Daily Mail, 22 CNN), cased, whole, with "
    f"their highlights, from BUMP (Ma et al. 2023), {_BUMP_REPO}, commit {_BUMP_COMMIT}, "
    "data/task1_dataset.json (3,852,954 bytes, sha256 419c37fd...2b47e) and "
    "data/task2_dataset.json (1,060,175 bytes, sha256 b4b03a80...47a5d), converted by "
    "evaluation.cnn_dailymail_cased; source by BUMP's test-split index (CNN first)",
    licence=_CASED_LICENCE,
    how_to_get=f"git clone https://{_BUMP_REPO} bump && mkdir -p .nightshift/eval/bump && "
    + " && ".join(
        f"git -C bump show {_BUMP_COMMIT}:data/{t}_dataset.json > .nightshift/eval/bump/{t}.json"
        for t in ("task1", "task2")
    )
    + " && python -m evaluation.cnn_dailymail_cased bump "
    ".nightshift/eval/cnn_dailymail_test_bump.csv .nightshift/eval/bump/task1.json "
    ".nightshift/eval/bump/task2.json",
    every=4,
    urls=None,
)

TEST_FRANK = Dataset(
    name="cnn_dailymail_test_frank",
    file="cnn_dailymail_test_frank.csv",
    sha256="c4aacda6d30f07c2f5c70920080118a9f498f26929ccfe4116ae08e3e4097dca",
    source="244 CNN/DailyMail test articles (222 Daily Mail, 22 CNN; FRANK's 250 less the 6 "
    "BUMP also has), cased, as the summarisers read them (whole, but the Daily Mail ones with "
    "caption and heading lines run into the next sentence without a period), with their highlights "
    f"(detokenised), from FRANK (Pagnoni et al. 2021), {_FRANK_REPO}, commit {_FRANK_COMMIT}, "
    "data/articles-wbertscore-json/<sha1 of the URL>.json, converted by "
    "evaluation.cnn_dailymail_cased in the order of the test URL list "
    "(github.com/abisee/cnn-dailymail b15ad0a, url_lists/all_test.txt, sha256 "
    "c4f5efb5...09bd); source by each article's URL",
    licence=_CASED_LICENCE,
    how_to_get=f"git clone https://{_FRANK_REPO} frank && mkdir -p .nightshift/eval/frank && "
    f"git -C frank archive {_FRANK_COMMIT} data/articles-wbertscore-json | tar -x "
    "--strip-components=2 -C .nightshift/eval/frank && git clone "
    "https://github.com/abisee/cnn-dailymail && git -C cnn-dailymail show "
    "b15ad0a2db0d407a84b8ca9b5731e1f1c4bd24b9:url_lists/all_test.txt > "
    ".nightshift/eval/cnn_dailymail_all_test_urls.txt && "
    "python -m evaluation.cnn_dailymail_cased frank .nightshift/eval/cnn_dailymail_test_frank.csv "
    ".nightshift/eval/cnn_dailymail_all_test_urls.txt .nightshift/eval/frank --exclude "
    ".nightshift/eval/cnn_dailymail_test_bump.csv",
    every=4,
    urls=None,
)

_TEST_CHUNKS = {  # name: (first position in the test URL list, bytes, sha256)
    "test_000": (0, 4120595, "15bba3cf33afb1fff98a96358cbb320fc5a301e6de639eebe64959f177794ac4"),
    "test_001": (1000, 3471553, "4d969020011b0c521b022363446516287f342f541aa8a94a1dbe26c52203d759"),
    "test_002": (2000, 3580272, "3eef9a0ecbf7636e0350d2711dd34ceace2f930d922f8f2399dbc0ffdae3064a"),
    "test_003": (3000, 3512801, "509d6d6798cd1a8889107e380d8b5d21f8edbc84374876b0470911be04472849"),
    "test_011": (
        11000,
        2426336,
        "d39656aafa9d5bd6218185ff7e40630c34b06efbc8cfb929864db78c6b197709",
    ),
}

TEST_URLS = Dataset(
    name="cnn_dailymail_test_urls",
    file="cnn_dailymail_all_test_urls.txt",
    sha256="c4f5efb5ec2126430a5c156efbd13d0e9c4cb490169e552c38b4a51981a009bd",
    source="the 11,490 test URLs (the ids are their sha1) as committed in "
    "github.com/abisee/cnn-dailymail, commit b15ad0a2db0d407a84b8ca9b5731e1f1c4bd24b9, "
    "url_lists/all_test.txt (2,109,547 bytes)",
    licence="MIT (Abigail See), a list of URLs; kept in the cache beside the articles",
    how_to_get="git clone https://github.com/abisee/cnn-dailymail && "
    "git -C cnn-dailymail show b15ad0a2db0d407a84b8ca9b5731e1f1c4bd24b9:url_lists/all_test.txt "
    "> .nightshift/eval/cnn_dailymail_all_test_urls.txt",
    urls=None,
)

TEST_CHUNKS = Dataset(
    name="cnn_dailymail_test_chunks",
    file="cnn_dailymail_test_chunks_tokenised.csv",
    sha256="0b98fc43f2956b8844ade9a61d649f2f8216bda4eb958b1c29417b43730e2382",
    source="CNN/DailyMail test articles 0-3,999 and 11,000-11,489 (1,093 CNN first, then Daily "
    "Mail), whole, in See et al.'s tokenised lower-case form, from " + _chunks_source(_TEST_CHUNKS),
    licence=_CHUNKS_LICENCE,
    how_to_get=_chunks_how_to_get(
        _TEST_CHUNKS, "cnn_dailymail_test_chunks_tokenised.csv", "cnn_dailymail_all_test_urls.txt"
    ),
    every=10,
    # Test articles: nothing is tuned or trained on them.
    tuning=(),
    forms=("tokenised",),
    urls="cnn_dailymail_test_urls",
)

_STORIES_REPO = "github.com/chihiro2101/cnndaily_tbga"
_STORIES_COMMIT = "24370d3350b8ce6a4d8ba8a6fa8035cfba4d65fb"

TEST_CASED = Dataset(
    name="cnn_dailymail_test_cased",
    file="cnn_dailymail_test_cased.csv",
    sha256="4816a93f2b1384353548a90c0fc9249441110b19f6c208de83bec4594753e4d3",
    source="4,365 of the 4,490 test articles of cnn_dailymail_test_chunks (those the stories "
    f"hold), whole and cased, from {_STORIES_REPO}, commit {_STORIES_COMMIT}, "
    "stories/<sha1 of the URL>.story (cased Stanford tokens, no highlights), each paired with "
    "its highlights from those chunks and both turned into prose by "
    "evaluation.cnn_dailymail_cased (the chunk's words checked to be the story's)",
    licence="articles and highlights: copyright CNN and the Daily Mail, distributed for research "
    "(Hermann et al. 2015; See et al. 2017); the repositories state no licence. Not committed "
    "here.",
    how_to_get=f"git clone https://{_STORIES_REPO} stories && mkdir -p .nightshift/eval/tbga && "
    f"git -C stories archive {_STORIES_COMMIT} stories | tar -x --strip-components=1 -C "
    ".nightshift/eval/tbga && python -m evaluation.cnn_dailymail_cased stories "
    ".nightshift/eval/cnn_dailymail_test_cased.csv "
    ".nightshift/eval/cnn_dailymail_test_chunks_tokenised.csv .nightshift/eval/tbga "
    "(after getting cnn_dailymail_test_chunks)",
    every=10,
    tuning=(),
    urls="cnn_dailymail_test_urls",
)

# The evaluation sets, by name: CNN (both forms), mostly Daily Mail (tokenised form only), and
# the cased test articles, mostly Daily Mail (both forms).
DATASETS = {
    d.name: d
    for d in (CNN_DAILYMAIL, VALIDATION_CHUNKS, TEST_CHUNKS, TEST_CASED, TEST_BUMP, TEST_FRANK)
}
URL_LISTS = {d.name: d for d in (VALIDATION_URLS, TEST_URLS)}


@dataclass(frozen=True)
class Example:
    doc_id: str
    article: str
    reference: str  # one highlight per line
    source: str | None = None  # cnn or dailymail, where the file says it


def dataset_path(dataset: Dataset = CNN_DAILYMAIL, cache: Path = CACHE) -> Path:
    """The cached file, checked against its sha256; raises with the way to get it if missing."""
    path = cache / dataset.file
    if not path.exists():
        raise FileNotFoundError(
            f"{dataset.name} is not in {cache} (it is not committed: {dataset.licence}). "
            f"Get it with:\n  {dataset.how_to_get}"
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != dataset.sha256:
        raise ValueError(f"{path}: sha256 {digest}, expected {dataset.sha256}; fetch it again")
    return path


def load_examples(path: Path) -> list[Example]:
    """Rows of a CSV with ``article``, ``highlights`` (one per line) and ``id`` columns, and a
    ``source`` one where the file says each article's source."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return [
        Example(r["id"], r["article"], r["highlights"].strip(), r.get("source") or None)
        for r in rows
    ]


def every_kth(examples: Sequence[Example], every: int, offset: int) -> list[Example]:
    """Every ``every``-th example from ``offset``: a sample spread over the whole file."""
    if not 0 <= offset < every:
        raise ValueError(f"offset {offset} must be in [0, {every})")
    return list(examples[offset::every])


def report_offsets(every: int) -> list[int]:
    """The reported samples' starts: k/4, k/2 and 3k/4, none of them the tuning sample's 0."""
    return sorted({max(1, every * q // 4) for q in (1, 2, 3)} - {0}) if every > 1 else [0]


def article_sources(examples: Sequence[Example], urls: Path | None) -> dict[str, str]:
    """Each article's source, ``cnn`` or ``dailymail``: as its file says, else by the URL its
    id is the sha1 of, when the URL list has it, else by its dateline (``unknown`` when none
    says)."""
    by_id = {}
    if urls is not None:
        for url in urls.read_text(encoding="utf-8").split():
            by_id[hashlib.sha1(url.encode()).hexdigest()] = url
    return {e.doc_id: e.source or _source(by_id.get(e.doc_id), e.article) for e in examples}


def _source(url: str | None, article: str) -> str:
    if url is not None:
        return "cnn" if "cnn.com" in url else "dailymail" if "dailymail.co.uk" in url else "unknown"
    # The datelines in either form: "(CNN)" / "( cnn )", "By . Jo Bloggs . PUBLISHED: .".
    head = article[:400].lower()
    if "(cnn)" in head or "( cnn )" in head:
        return "cnn"
    if head.startswith("by . ") or "published: ." in head:
        return "dailymail"
    return "unknown"


# -- the tokenised lower-case form -----------------------------------------------------------
_BRACKETS = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-"}
_CLITIC = re.compile(r"(?i)^(.+?)(n't|'s|'re|'ve|'ll|'m|'d)$")
_LEADING = "\"'“‘`([{"
_TRAILING = "\"'”’,;:!?)]}"


def ptb_tokenise(text: str) -> str:
    """Lower-cased Penn-Treebank-style tokens, sentence-final periods as tokens of their own.

    Sentences are found by :func:`split_sentences` on the plain text, so a period ends a
    sentence here exactly where the plain form's segmentation says it does; abbreviations
    ("mr.", "u.s.") keep their periods, as in the corpora that ship this form.
    """
    out = []
    for sentence in split_sentences(text):
        tokens: list[str] = []
        for word in re.sub(r"([()\[\]{}])", r" \1 ", sentence).split():
            tokens.extend(_tokenise_word(word))
        _detach_final_period(tokens)
        out.append(" ".join(_BRACKETS.get(t, t) for t in tokens).lower())
    return " ".join(out)


def _detach_final_period(tokens: list[str]) -> None:
    """A sentence's last period becomes a token of its own, before any closing quotes; an
    abbreviation keeps its period and gets the sentence's after it ("u.s. .")."""
    k = len(tokens) - 1
    while k >= 0 and tokens[k] in {"''", "'", ")", "]", "}"}:
        k -= 1
    if k < 0 or not tokens[k].endswith(".") or tokens[k] in {".", "..."}:
        return
    word = tokens[k]
    if "." in word[:-1] or word[:-1].lower() in ABBREVIATIONS or len(word) == 2:
        tokens.insert(k + 1, ".")
    else:
        tokens[k : k + 1] = [word[:-1], "."]


def _tokenise_word(word: str) -> list[str]:
    lead, tail = [], []
    while word and word[0] in _LEADING:
        lead.append("``" if word[0] in '"“' else word[0])
        word = word[1:]
    while word and word[-1] in _TRAILING:
        tail.insert(0, "''" if word[-1] in '"”' else word[-1])
        word = word[:-1]
    middle = [word] if word else []
    clitic = _CLITIC.match(word) if word else None
    if clitic and clitic.group(1).isalpha():
        middle = [clitic.group(1), clitic.group(2)]
    return [*lead, *middle, *tail]


# -- methods -----------------------------------------------------------------------------------
class CachedEmbeddings:
    """Sentence embeddings from :func:`inference.text.embeddings.encode`, kept on disk between runs."""

    def __init__(self, encoder: SentenceEncoder, cache: Path, max_batch_tokens: int = 2048):
        self.encoder, self.max_batch_tokens = encoder, max_batch_tokens
        self.file = cache / f"embeddings-{encoder.version}.npz"
        self.vectors: dict[str, np.ndarray] = {}
        if self.file.exists():
            saved = np.load(self.file)
            self.vectors = dict(zip(saved["keys"].tolist(), saved["vectors"], strict=True))

    def __call__(self, sentences: Sequence[str]) -> torch.Tensor:
        keys = [hashlib.sha1(s.encode()).hexdigest() for s in sentences]
        pending = {k: s for k, s in zip(keys, sentences, strict=True) if k not in self.vectors}
        missing = list(pending.items())
        if missing:
            out = encode(self.encoder, [s for _, s in missing], self.max_batch_tokens, 64)
            for (key, _), row in zip(missing, out.vectors.numpy(), strict=True):
                self.vectors[key] = row.astype(np.float32)
        width = self.encoder.model.config.hidden_size
        rows = [self.vectors[k] for k in keys]
        return torch.from_numpy(np.stack(rows)) if rows else torch.empty(0, width)

    def save(self) -> None:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        keys = np.array(list(self.vectors), dtype="U40")
        vectors = np.stack(list(self.vectors.values())) if self.vectors else np.zeros((0, 384))
        np.savez(self.file, keys=keys, vectors=vectors)


Method = Callable[[list[str], Callable[[Sequence[str]], torch.Tensor]], str]


def nightshift(cap: LengthCap, ranking: RankerSettings) -> Method:
    """The asset's extractive summariser on one document's sentences."""

    def summarise(sentences: list[str], embed) -> str:
        readable = encoder_can_read(" ".join(sentences))
        vectors = embed(sentences) if readable and sentences else None
        return summarise_sentences(sentences, vectors, cap, ranking)

    return summarise


def lead(count: int = 3) -> Method:
    """The first ``count`` sentences (Lead-3 for 3), uncapped, as the baseline is published."""
    return lambda sentences, embed: " ".join(sentences[:count])


def default_methods() -> dict[str, Method]:
    from assets.summaries.document_summaries import SummariesConfig, length_cap

    config = SummariesConfig()
    cap = length_cap(config)
    return {
        "nightshift": nightshift(cap, RankerSettings(method=config.ranking)),
        # The same cap and segmentation with the first sentences: what the ranking itself adds.
        "nightshift ranking=lead": nightshift(cap, RankerSettings(method="lead")),
        "lead-3": lead(3),
    }


# -- scoring -----------------------------------------------------------------------------------
def rouge(pairs: Sequence[tuple[str, str]]) -> dict[str, float]:
    """Mean ROUGE-1/2/Lsum F1 (x100) over (summary, reference) pairs; Lsum on sentence lines."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(METRICS), use_stemmer=True)
    totals = dict.fromkeys(METRICS, 0.0)
    for summary, reference in pairs:
        lines = "\n".join(split_sentences(summary))
        scores = scorer.score(reference, lines)
        for metric in METRICS:
            totals[metric] += scores[metric].fmeasure
    return {m: round(100 * totals[m] / max(1, len(pairs)), 2) for m in METRICS}


def forms(example: Example, pretokenised: bool = False) -> dict[str, tuple[str, str]]:
    """The article and its reference in each form: plain (cased) and tokenised lower-case; an
    example already in the tokenised form (``pretokenised``) has that form only, as it is."""
    reference_lines = [line.strip() for line in example.reference.splitlines() if line.strip()]
    if pretokenised:
        return {"tokenised": (example.article, "\n".join(reference_lines))}
    return {
        "plain": (example.article, "\n".join(reference_lines)),
        "tokenised": (
            ptb_tokenise(example.article),
            "\n".join(ptb_tokenise(line) for line in reference_lines),
        ),
    }


def evaluate(
    data: Path | None = None,
    *,
    every: int | None = None,
    offsets: Sequence[int] | None = None,
    methods: dict[str, Method] | None = None,
    encoder: SentenceEncoder | None = None,
    cache: Path = CACHE,
    urls: Path | None = None,
    dataset: Dataset = CNN_DAILYMAIL,
    pretokenised: bool = False,
) -> list[dict]:
    """Scores each method on each form of every ``every``-th article from each of ``offsets``,
    over all of them and over each source apart.

    Args:
        data: a CSV of article, highlights, id; default the cached file of ``dataset``.
        every: take every k-th article of the file (default the dataset's).
        offsets: where each sample starts (default :func:`report_offsets`; the ranker was
            tuned on offset 0).
        methods: name -> summariser; default nightshift (the asset's config) and Lead-3.
        encoder: the sentence encoder; default the packaged MiniLM on the CPU.
        cache: where embeddings are kept between runs.
        urls: the URL list the ids hash; default the dataset's cached one for its own file
            (articles it does not list are told apart by their dateline).
        dataset: the cached set read when ``data`` is not given.
        pretokenised: ``data`` is already tokenised lower-case: score that form only, as is.

    Returns:
        rows of dataset (name, source and form), method, metric (rouge1, rouge2, rougeLsum,
        summary_words), value, documents.
    """
    label, examples, groups, pretokenised = _sample(
        data, every, offsets, cache, urls, dataset, pretokenised
    )
    methods = methods or default_methods()
    encoder = encoder or load_sentence_encoder(make_runtime("cpu", "fp32"))
    embed = CachedEmbeddings(encoder, cache)
    rows = []
    try:
        for form in ("tokenised",) if pretokenised else ("tokenised", "plain"):
            scored = {
                m: _summaries(method, examples, form, embed, pretokenised)
                for m, method in methods.items()
            }
            for group, members in groups.items():
                keep = {e.doc_id for e in members}
                for name, pairs in scored.items():
                    chosen = [
                        pair for e, pair in zip(examples, pairs, strict=True) if e.doc_id in keep
                    ]
                    rows += _scores(f"{label} {group} ({form})", name, chosen)
    finally:
        embed.save()
    return rows


def _sample(
    data: Path | None,
    every: int | None,
    offsets: Sequence[int] | None,
    cache: Path,
    urls: Path | None,
    dataset: Dataset,
    pretokenised: bool,
) -> tuple[str, list[Example], dict[str, list[Example]], bool]:
    """The sample :func:`evaluate` scores: its label, its articles, them by source ("all"
    first), and whether it is tokenised already."""
    path = data or dataset_path(dataset, cache)
    if urls is None and data is None and dataset.urls is not None:
        urls = dataset_path(URL_LISTS[dataset.urls], cache)
    if data is None:
        pretokenised = dataset.forms == ("tokenised",)
    every = every or (dataset.every if data is None else EVERY)
    offsets = report_offsets(every) if offsets is None else list(offsets)
    loaded = load_examples(path)
    examples = [e for offset in offsets for e in every_kth(loaded, every, offset)]
    source = article_sources(examples, urls)
    groups = {"all": examples}
    for name in (*SOURCES, "unknown"):
        members = [e for e in examples if source[e.doc_id] == name]
        if members:
            groups[name] = members
    starts = ",".join(map(str, offsets))
    label = path.stem if every == 1 else f"{path.stem}[{starts}::{every}]"
    return label, examples, groups, pretokenised


def paired_margins(
    dataset: Dataset = CNN_DAILYMAIL,
    *,
    data: Path | None = None,
    every: int | None = None,
    offsets: Sequence[int] | None = None,
    cache: Path = CACHE,
    encoder: SentenceEncoder | None = None,
) -> list[dict]:
    """Per source and form, nightshift's per-article ROUGE-1 lead over Lead-3 on the same
    articles: its mean, the mean's standard error, and the wins, ties and losses (a tie is
    mostly the same sentences), so a margin can be told from the spread between articles."""
    label, examples, groups, pretokenised = _sample(
        data, every, offsets, cache, None, dataset, False
    )
    methods = default_methods()
    embed = CachedEmbeddings(encoder or load_sentence_encoder(make_runtime("cpu", "fp32")), cache)
    rows = []
    try:
        for form in ("tokenised",) if pretokenised else ("tokenised", "plain"):
            ours, theirs = (
                _rouge1_each(_summaries(methods[m], examples, form, embed, pretokenised))
                for m in ("nightshift", "lead-3")
            )
            diff = dict(zip((e.doc_id for e in examples), ours - theirs, strict=True))
            for group, members in groups.items():
                d = np.array([diff[e.doc_id] for e in members])
                se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
                rows.append(
                    {
                        "dataset": f"{label} {group} ({form})",
                        "margin": round(float(d.mean()), 2),
                        "se": round(float(se), 2),
                        "wins": int((d > 1e-9).sum()),
                        "ties": int((abs(d) <= 1e-9).sum()),
                        "losses": int((d < -1e-9).sum()),
                        "documents": len(d),
                    }
                )
    finally:
        embed.save()
    return rows


def _rouge1_each(pairs: Sequence[tuple[str, str]]) -> np.ndarray:
    """ROUGE-1 F1 (x100) of each (summary, reference) pair, scored as :func:`rouge` does."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)
    return np.array(
        [
            100 * scorer.score(ref, "\n".join(split_sentences(s)))["rouge1"].fmeasure
            for s, ref in pairs
        ]
    )


def margins_table(rows: Sequence[dict]) -> str:
    """:func:`paired_margins` rows as a Markdown table."""
    head = "| dataset | margin | se | wins | ties | losses | documents |\n|---|---|---|---|---|---|---|"
    body = [
        f"| {r['dataset']} | {r['margin']:+.2f} | {r['se']:.2f} | {r['wins']} | {r['ties']} | "
        f"{r['losses']} | {r['documents']} |"
        for r in rows
    ]
    return "\n".join([head, *body])


def _summaries(
    method: Method, examples: Sequence[Example], form: str, embed, pretokenised: bool
) -> list[tuple]:
    """(summary, reference) per article in one form."""
    docs = [forms(e, pretokenised)[form] for e in examples]
    return [(method(split_sentences(article), embed), ref) for article, ref in docs]


def _scores(dataset: str, method: str, pairs: list[tuple[str, str]]) -> list[dict]:
    words = np.mean([len(s.split()) for s, _ in pairs]) if pairs else 0.0
    scores = {**rouge(pairs), "summary_words": round(float(words), 1)}
    return [_row(dataset, method, m, v, len(pairs)) for m, v in scores.items()]


def _row(dataset: str, method: str, metric: str, value: float, documents: int) -> dict:
    return {
        "dataset": dataset,
        "method": method,
        "metric": metric,
        "value": value,
        "documents": documents,
    }


GRID = {
    "lambda1": [-2.0, -1.0, -0.5, 0.0],
    "beta": [0.0, 0.3, 0.6],
    "lead_weight": [0.5, 1.0, 2.0, 4.0, 8.0],
}


def tune(
    data: Path | None = None,
    cache: Path = CACHE,
    every: int | None = None,
    urls: Path | None = None,
    datasets: Sequence[Dataset] = (CNN_DAILYMAIL,),
    pretokenised: bool = False,
    offsets: Sequence[int] | None = None,
) -> list[dict]:
    """The ranker grid on the tuning samples (offset 0 of each dataset or of ``data``, or
    ``offsets``, which must avoid the reported ones), all their forms and sources: ROUGE per
    setting, best first by its smallest ROUGE-1 margin over Lead-3 on any source and form."""
    from assets.summaries.document_summaries import SummariesConfig, length_cap

    cap = length_cap(SummariesConfig())
    methods: dict[str, Method] = {"lead-3": lead(3)}
    for lambda1, beta, weight in itertools.product(*GRID.values()):
        settings = RankerSettings(lambda1=lambda1, beta=beta, lead_weight=weight)
        methods[f"pacsum l1={lambda1} b={beta} lead={weight}"] = nightshift(cap, settings)
    samples = (
        [{"data": data, "pretokenised": pretokenised, "offsets": list(offsets or [0])}]
        if data
        else [{"dataset": d, "offsets": list(d.tuning)} for d in datasets]
    )
    rows = [
        row
        for sample in samples
        for row in evaluate(
            every=every,
            methods=methods,
            cache=cache,
            urls=urls,
            **sample,
        )
    ]
    margin = _worst_margin(rows)
    ranked = sorted(methods, key=lambda m: -margin[m])
    return [r for m in ranked for r in rows if r["method"] == m]


# A source with fewer articles than this in a sample does not decide the tuning: one of a few
# articles would (the validation chunks hold a few CNN articles beside the Daily Mail ones).
MIN_DOCUMENTS = 20


def _worst_margin(rows: Sequence[dict]) -> dict[str, float]:
    """Per method, its smallest ROUGE-1 lead over Lead-3 among the per-source datasets with at
    least :data:`MIN_DOCUMENTS` articles (all of them if none has so many)."""
    rouge1 = {(r["dataset"], r["method"]): r["value"] for r in rows if r["metric"] == "rouge1"}
    size = {r["dataset"]: r["documents"] for r in rows}
    parts = {d for d, _ in rouge1 if d.split(" ")[-2] != "all" and size[d] >= MIN_DOCUMENTS}
    parts = parts or {d for d, _ in rouge1}
    methods = {m for _, m in rouge1}
    return {m: min(rouge1[(d, m)] - rouge1[(d, "lead-3")] for d in parts) for m in methods}


def report(
    cache: Path = CACHE,
    datasets: Sequence[Dataset] | None = None,
    missing: list[str] | None = None,
) -> list[dict]:
    """The report samples of each evaluation set (default all of :data:`DATASETS`).

    A set not in the cache raises FileNotFoundError with the way to get it; given ``missing``,
    the other sets are still scored and each missing set's message is appended to it instead.
    """
    chosen = list(DATASETS.values()) if datasets is None else datasets
    rows = []
    for dataset in chosen:
        try:
            rows += evaluate(dataset=dataset, cache=cache)
        except FileNotFoundError as error:
            if missing is None:
                raise
            missing.append(str(error))
    return rows


def table(rows: Sequence[dict]) -> str:
    """The rows as a Markdown table, one line per dataset and method, one column per metric;
    a source with no article in the sample is named under it, so its absence is not silent."""
    out = metric_table(list(rows), "documents", 2)
    datasets = {r["dataset"] for r in rows}
    missing = [s for s in SOURCES if not any(f" {s} (" in d for d in datasets)]
    if rows and missing:
        out += f"\n\nNo article of the sample is from: {', '.join(missing)}."
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, help="CSV of article, highlights, id")
    parser.add_argument(
        "--dataset",
        nargs="+",
        choices=sorted(DATASETS),
        help="the cached evaluation sets (default all; ignored with --data)",
    )
    parser.add_argument(
        "--pretokenised", action="store_true", help="--data is tokenised lower-case already"
    )
    parser.add_argument("--urls", type=Path, help="the URL list whose sha1s are the ids")
    parser.add_argument(
        "--every", type=int, help=f"take every k-th article (default the dataset's, or {EVERY})"
    )
    parser.add_argument(
        "--offset", type=int, nargs="+", help="where the samples start (default k/4 k/2 3k/4)"
    )
    parser.add_argument("--tune", action="store_true", help="the ranker grid on offset 0")
    parser.add_argument(
        "--paired",
        action="store_true",
        help="per-article ROUGE-1 margin over Lead-3: mean, standard error, wins/ties/losses",
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--cache", type=Path, default=CACHE, help="data and embeddings cache")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        datasets = [DATASETS[n] for n in args.dataset or DATASETS]
        if args.paired:
            # With --data the file is the sample; the dataset only lends its defaults.
            margins = [
                row
                for dataset in ([CNN_DAILYMAIL] if args.data else datasets)
                for row in paired_margins(
                    dataset, data=args.data, every=args.every, offsets=args.offset, cache=args.cache
                )
            ]
            print(margins_table(margins))
            if args.json:
                args.json.write_text(json.dumps(margins, indent=2))
            return 0
        if args.tune:
            rows = tune(
                args.data,
                args.cache,
                args.every,
                args.urls,
                datasets,
                args.pretokenised,
                args.offset,
            )
        elif args.data:
            rows = evaluate(
                args.data,
                every=args.every,
                offsets=args.offset,
                cache=args.cache,
                urls=args.urls,
                pretokenised=args.pretokenised,
            )
        else:
            rows = [
                row
                for dataset in datasets
                for row in evaluate(
                    dataset=dataset, every=args.every, offsets=args.offset, cache=args.cache
                )
            ]
    except (FileNotFoundError, ValueError) as error:
        print(error, file=sys.stderr)
        return 2
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
