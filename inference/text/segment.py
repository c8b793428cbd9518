"""Sentences in any text a company lands, and the length a summary may have.

:func:`split_sentences` handles ordinary prose (abbreviations, initials, decimals, quotes),
tokenised lower-case corpora (`` . `` between sentences, ``-lrb-`` tokens), Chinese and
Japanese sentence ends (``。！？``, no space after them), Korean and other caseless scripts, and
text with no sentence punctuation at all: any sentence longer than a window is cut into windows
of words, or of characters for scripts written without spaces. So no "sentence" is ever a whole
document, and a summary made of sentences is bounded before any cap applies.

:class:`LengthCap` is the hard limit on a summary — sentences and words, or characters for text
without spaces — that the summariser applies and the published summaries' check enforces.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from dataclasses import dataclass

from inference.text.normalise import normalise_text

# A period after these is not a sentence end; single letters cover initials ("J. Smith").
ABBREVIATIONS = frozenset(
    """mr mrs ms dr prof sr jr st mt gen gov sen rep rev col lt sgt capt cmdr adm pres inc ltd
    co corp bros vs etc approx dept univ est ave blvd jan feb mar apr jun jul aug sep sept oct
    nov dec u.s u.k u.n u.s.a e.g i.e a.m p.m cf al""".split()
)
# Abbreviations only before a number ("No. 5", "Fig. 2"); elsewhere "no." ends a sentence.
NUMBER_ABBREVIATIONS = frozenset({"no", "nos", "fig", "vol", "pp", "art", "nr"})
# Sentence ends of scripts that put no space after them.
_CJK_END = re.compile(r"[。！？｡]+[”’」』）〕】》\"')\]]*")
# A run of sentence-final punctuation, its closing quotes or brackets, then a space.
_END = re.compile(r"([.!?…؟।॥۔։።]+)([\"'”’»)\]]*)(?=\s)")
_CLOSING_TOKENS = frozenset({"''", "'", '"', "”", "’", "»", ")", "]", "-rrb-", "-rsb-", "-rcb-"})
_OPENERS = "\"'“‘«([{¿¡-—–*•"
# Scripts written without spaces between words.
_UNSPACED = re.compile(
    "[\u0e00-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff\u3000-\u30ff\u31f0-\u31ff"
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003ffff]"
)
# Text whose tokens average more characters than this has no word spacing to speak of.
_SPACED_TOKEN_CHARS = 12

# Bounds on one sentence: longer "sentences" (no punctuation, a list, a table dump) are cut.
WINDOW_WORDS = 80
WINDOW_CHARS = 160


def is_unspaced(text: str) -> bool:
    """Whether ``text`` is written without spaces between words (Chinese, Japanese, Thai, a run
    of emoji), so that its length is counted in characters rather than words."""
    tokens = text.split()
    if not tokens:
        return False
    chars = sum(len(t) for t in tokens)
    return chars / len(tokens) > _SPACED_TOKEN_CHARS or len(_UNSPACED.findall(text)) > 0.3 * chars


def split_sentences(
    text: str | None, *, window_words: int = WINDOW_WORDS, window_chars: int = WINDOW_CHARS
) -> list[str]:
    """Splits text into sentences, each at most ``window_words`` words (or ``window_chars``
    characters where the text has no spaces).

    The text is normalised first (HTML to text, NFC, whitespace; see
    :func:`inference.text.normalise.normalise_text`); blank lines always end a sentence. Every
    sentence returned is a substring of the normalised text (:func:`sentence_spans` says where).
    """
    flat = normalise_text(text)
    return [flat[start:end] for start, end in _spans(flat, window_words, window_chars)]


def sentence_spans(
    normalised: str, *, window_words: int = WINDOW_WORDS, window_chars: int = WINDOW_CHARS
) -> list[tuple[int, int]]:
    """Where each of :func:`split_sentences`' sentences lies in already normalised text:
    ``(start, end)`` character offsets, in order, so ``normalised[start:end]`` is the sentence.

    Args:
        normalised: text as :func:`inference.text.normalise.normalise_text` returns it.
        window_words: as for :func:`split_sentences`.
        window_chars: as for :func:`split_sentences`.
    """
    return _spans(normalised, window_words, window_chars)


def _spans(flat: str, window_words: int, window_chars: int) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    offset = 0
    for paragraph in flat.split("\n\n"):
        lower_case = not any(c.isupper() for c in paragraph)
        # Tokenised corpora detach every sentence-final period (" . "): a period still attached
        # to a word there ("mr.", "u.s.", "no.") is an abbreviation.
        tokenised = lower_case and " . " in f" {paragraph} "
        cursor = 0
        for piece in _split_paragraph(paragraph, lower_case, tokenised):
            for sentence in _windows(piece, window_words, window_chars):
                if not sentence:
                    continue
                # Pieces and windows are stripped substrings, in order: the next occurrence
                # from the cursor is the one the splitter cut.
                start = paragraph.find(sentence, cursor)
                if start < 0:
                    raise AssertionError(f"sentence {sentence[:60]!r} is not text of its paragraph")
                cursor = start + len(sentence)
                spans.append((offset + start, offset + cursor))
        offset += len(paragraph) + 2
    return spans


# Text whose line ends were lost (a caption or heading run into the sentence after it, as in
# text scraped without its markup) shows a sentence opener with a capital straight after a
# word: "... in 1985 The company said". Only openers that almost never take a capital
# mid-sentence before a lower-case word are cut at (counted in docs/benchmarks.md,
# "Summaries on the cased test articles"); "It", "In" and "A" open titles and names too often. A cut that
# would leave fewer than RUN_ON_MIN_WORDS words before it is a dateline or a list number
# ("(CNN) The ...", "Washington (CNN) The ...", "5 After ..."), not a lost line end.
_RUN_ON = re.compile(
    r"(?<=[^\W_]|[)\]”’\"']) (?=(?:The|He|She|His|Her|But|After|When|There|They|This) [a-z])"
)
RUN_ON_MIN_WORDS = 4


def _split_paragraph(paragraph: str, lower_case: bool, tokenised: bool) -> list[str]:
    cuts = {m.end() for m in _CJK_END.finditer(paragraph)}
    for match in _END.finditer(paragraph):
        if _ends_sentence(paragraph, match, lower_case, tokenised):
            cuts.add(_after_closers(paragraph, match.end()))
    if not lower_case:
        cuts.update(_run_on_cuts(paragraph, cuts))
    pieces, start = [], 0
    for cut in sorted(cuts):
        pieces.append(paragraph[start:cut].strip())
        start = cut
    pieces.append(paragraph[start:].strip())
    return [p for p in pieces if p]


def _run_on_cuts(paragraph: str, cuts: set[int]) -> list[int]:
    """Where a sentence run into the previous one starts (see :data:`_RUN_ON`), where at least
    :data:`RUN_ON_MIN_WORDS` words lie between it and the cut before it."""
    found: list[int] = []
    bounds = sorted(cuts)
    for match in _RUN_ON.finditer(paragraph):
        at = match.start()
        earlier = bisect.bisect_left(bounds, at)
        before = max(bounds[earlier - 1] if earlier else 0, found[-1] if found else 0)
        # A quote that follows a colon or comma opens what is quoted ("said: ' They put").
        opens_quote = paragraph[before:at].rstrip("'\" ").endswith((":", ","))
        # Counting spaces, not splitting: the paragraph is single-spaced after normalisation.
        words = paragraph.count(" ", before, at) + (before == 0)
        if words >= RUN_ON_MIN_WORDS and not opens_quote:
            found.append(at)
    return found


def _after_closers(paragraph: str, cut: int) -> int:
    """Moves a cut past closing quotes and brackets written as tokens of their own
    (``. ''`` and ``. -rrb-`` in tokenised corpora): they belong to the sentence they close."""
    while True:
        token = _token_at(paragraph, cut + 1)
        if token not in _CLOSING_TOKENS:
            return cut
        cut += 1 + len(token)


def _token_at(paragraph: str, start: int) -> str:
    """The token starting at ``start`` (paragraphs are single-spaced after normalisation);
    found without copying the rest of the paragraph, so splitting stays linear in its size."""
    end = paragraph.find(" ", start)
    return paragraph[start : end if end >= 0 else len(paragraph)]


def _ends_sentence(paragraph: str, match: re.Match, lower_case: bool, tokenised: bool) -> bool:
    """Whether the punctuation run ``match`` (followed by a space) ends a sentence."""
    start = match.start()
    word = paragraph[paragraph.rfind(" ", 0, start) + 1 : start]
    following = _token_at(paragraph, match.end() + 1)
    if not following:
        return True
    starts = _starts_sentence(following, lower_case)
    marks = match.group(1)
    if not word:
        # A token of its own (" . " in tokenised corpora) ends a sentence whatever follows;
        # a free-standing ellipsis only before what looks like a new sentence.
        return starts or marks in {".", "!", "?"}
    if marks != "." or match.group(2):
        return starts
    if tokenised:
        return False
    stem = word.lstrip(_OPENERS).lower()
    if stem in NUMBER_ABBREVIATIONS and following[:1].isdigit():
        return False
    if stem in ABBREVIATIONS or (len(stem) == 1 and stem.isalpha()):
        return False
    if re.fullmatch(r"(?:[^\W\d_]\.)+[^\W\d_]?", stem):  # "U.S.", "e.g.", "a.m."
        return False
    return starts


def _starts_sentence(token: str, lower_case: bool) -> bool:
    """Whether ``token`` can open a sentence: a capital, a digit, a caseless letter (Korean,
    Arabic, Chinese...), or anything at all in text written without capitals."""
    core = token.lstrip(_OPENERS)
    if not core:
        return True
    first = core[0]
    if first.isdigit() or first.isupper() or lower_case:
        return True
    return first.isalpha() and not first.islower()


def _windows(sentence: str, window_words: int, window_chars: int) -> list[str]:
    """Cuts an over-long sentence into windows of words, or of characters without spaces."""
    if is_unspaced(sentence):
        return _char_windows(sentence, window_chars)
    tokens = sentence.split(" ")
    if len(tokens) <= window_words and all(len(t) <= window_chars for t in tokens):
        return [sentence]
    out: list[str] = []
    current: list[str] = []
    for token in tokens:
        if len(token) > window_chars:
            # A token longer than a window (a URL, base64, a run of emoji): its own windows.
            out.extend([" ".join(current)] if current else [])
            out.extend(_char_windows(token, window_chars))
            current = []
            continue
        current.append(token)
        if len(current) >= window_words:
            out.append(" ".join(current))
            current = []
    if current:
        out.append(" ".join(current))
    return out


def _char_windows(text: str, size: int) -> list[str]:
    """Cuts ``text`` into pieces of at most ``size`` characters, at a space or clause mark in
    the second half of a piece when there is one, never inside a combined character."""
    out = []
    while len(text) > size:
        cut = max(text.rfind(mark, size // 2, size) for mark in " ，、,；;：:")
        cut = cut + 1 if cut > 0 else size
        while 0 < cut < len(text) and _joins(text[cut - 1], text[cut]):
            cut -= 1
        cut = cut or size
        out.append(text[:cut].strip())
        text = text[cut:].strip()
    if text:
        out.append(text)
    return [p for p in out if p]


def _joins(left: str, right: str) -> bool:
    """Whether a cut between ``left`` and ``right`` would split one visible character."""
    return (
        left == "\u200d"
        or right in "\u200d\ufe0f\ufe0e"
        or unicodedata.combining(right) > 0
        or unicodedata.category(right) in {"Mn", "Me", "Sk"}
        or 0x1F3FB <= ord(right) <= 0x1F3FF  # skin-tone modifiers
    )


# -- the hard length cap ---------------------------------------------------------------------
@dataclass(frozen=True)
class LengthCap:
    """The longest summary allowed: at most ``max_sentences`` sentences and ``max_words``
    words, or ``max_chars`` characters (spaces not counted) for text written without spaces."""

    max_sentences: int = 3
    max_words: int = 100
    max_chars: int = 300

    def __post_init__(self) -> None:
        if min(self.max_sentences, self.max_words, self.max_chars) < 1:
            raise ValueError(f"a length cap needs every limit >= 1, got {self}")


@dataclass(frozen=True)
class SummaryLength:
    """How long a text is, in the units the cap counts."""

    sentences: int
    words: int
    chars: int
    unspaced: bool


def measure(text: str | None) -> SummaryLength:
    """Sentences, words (tokens that are not punctuation alone) and non-space characters of
    ``text`` (after normalisation)."""
    flat = normalise_text(text)
    tokens = flat.split()
    return SummaryLength(
        sentences=len(split_sentences(flat)),
        words=sum(1 for t in tokens if not _punctuation_only(t)),
        chars=sum(len(t) for t in tokens),
        unspaced=is_unspaced(flat),
    )


def _punctuation_only(token: str) -> bool:
    """A token of punctuation alone ("," or "``" in tokenised text) is not a word."""
    return all(unicodedata.category(c)[0] == "P" or unicodedata.category(c) == "Sk" for c in token)


def within_cap(text: str | None, cap: LengthCap) -> bool:
    """Whether ``text`` fits the cap: sentences, and words or (unspaced) characters."""
    size = measure(text)
    if size.sentences > cap.max_sentences:
        return False
    return size.chars <= cap.max_chars if size.unspaced else size.words <= cap.max_words


def truncate(text: str, cap: LengthCap) -> str:
    """The longest prefix of one sentence that fits the cap (words, or characters)."""
    if within_cap(text, cap):
        return text
    if not is_unspaced(text):
        tokens, words = text.split(" "), 0
        for end, token in enumerate(tokens, start=1):
            words += not _punctuation_only(token)
            if words > cap.max_words:
                text = " ".join(tokens[: end - 1])
                break
    while len(text) > 1 and not within_cap(text, cap):
        pieces = _char_windows(text, max(1, min(len(text) - 1, cap.max_chars)))
        text = pieces[0] if pieces else ""
    return text


def fit_to_cap(sentences: list[str], order: list[int], cap: LengthCap) -> list[int]:
    """The sentences to keep, by rank, while the summary (in document order) fits the cap.

    Args:
        sentences: the document's sentences, in document order.
        order: sentence indices, best first.
        cap: the length cap.

    Returns:
        kept indices in document order; empty when nothing fits (see :func:`truncate`).
    """
    kept: list[int] = []
    for index in order:
        if len(kept) >= cap.max_sentences:
            break
        trial = sorted([*kept, index])
        if within_cap(join_sentences([sentences[i] for i in trial]), cap):
            kept = trial
    return kept


def join_sentences(sentences: list[str]) -> str:
    """Sentences as one text that splits back into exactly them: joined by a space where that
    keeps them apart, else by a paragraph break (a window of unpunctuated text, a heading)."""
    out = sentences[0] if sentences else ""
    for previous, sentence in zip(sentences, sentences[1:], strict=False):
        spaced = f"{previous} {sentence}"
        out += " " if split_sentences(spaced) == [previous, sentence] else "\n\n"
        out += sentence
    return out


def fit_summary(text: str, cap: LengthCap) -> str:
    """A written (abstractive) summary cut to the cap: its first sentences while they fit,
    else the longest prefix of its first sentence that does."""
    sentences = split_sentences(text)
    if not sentences:
        return ""
    count = 0
    while count < len(sentences) and within_cap(join_sentences(sentences[: count + 1]), cap):
        count += 1
    return join_sentences(sentences[:count]) if count else truncate(sentences[0], cap)
