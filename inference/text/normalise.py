"""Plain text from whatever a company lands: HTML pages, entity-escaped feeds, odd whitespace.

Everything downstream (sentence splitting, ranking, the checks that a summary is drawn from its
document) works on the text :func:`normalise_text` returns, never on the raw body, so markup
can never reach a summary. Nor can a link target: a summary is prose that a digest or a page
renders, and a target (``javascript:``, ``data:``) is where script rides along.
"""

from __future__ import annotations

import html
import re
import unicodedata
from html.parser import HTMLParser

# What makes a body HTML rather than prose that mentions "<" or "&": a doctype, a comment or
# one of the tags pages are made of. Anything else is treated as text.
_LOOKS_LIKE_HTML = re.compile(
    r"<!doctype|<!--|</?(?:html|head|body|div|p|span|a|br|hr|script|style|h[1-6]|li|ul|ol|"
    r"table|tr|td|th|img|meta|link|title|section|article|header|footer|nav|main|em|strong|"
    r"b|i|u|blockquote|pre|code|figure|figcaption|form|input|button|iframe|noscript)\b[^>]*>",
    re.IGNORECASE,
)
# Entities with their closing semicolon only: "AT&T" or "&notice" in prose stay as written.
_ENTITY = re.compile(r"&(?:#\d{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
# Content that is not text a reader sees.
_SKIPPED = {"script", "style", "noscript", "template", "head", "svg", "math", "iframe", "object"}
# Elements that end a block of text: their boundaries are paragraph breaks.
_BLOCKS = {
    "address", "article", "aside", "blockquote", "br", "caption", "dd", "div", "dl", "dt",
    "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header",
    "hr", "li", "main", "nav", "ol", "p", "pre", "section", "table", "tbody", "td", "tfoot",
    "th", "thead", "title", "tr", "ul",
}  # fmt: skip
# Characters that take no room and would split words or hide inside them.
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u2060\ufeff\u00ad"), None)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")
# A markdown inline link or image, `[text](target "title")`: the text stays, the target goes.
# The target may hold one level of parentheses, as `javascript:alert(1)` does.
_MARKDOWN_LINK = re.compile(
    r"!?\[([^\[\]\n]*)\]\(\s*(?:<[^<>\n]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)"
    r"(?:\s+(?:\"[^\"\n]*\"|'[^'\n]*'|\([^()\n]*\)))?\s*\)"
)
# An autolink, `<scheme:...>`: a web address stays as text, any other scheme goes.
_AUTOLINK = re.compile(r"<([A-Za-z][A-Za-z0-9+.-]{1,31}):([^<>\s]*)>")
_WEB_SCHEMES = {"http", "https"}
# A URL in a scheme that runs code, or a data URL. What follows the colon tells a URL from
# prose ("JavaScript: a language", "data: 5 rows"): no space, and a data URL's comma. Matched
# after invisible characters are gone, so `java\u200bscript:` cannot slip through.
_UNSAFE_URL = re.compile(r"\b(?:(?:java|vb|live)script:\S+|data:[^\s,]*,\S*)", re.IGNORECASE)


class _TextExtractor(HTMLParser):
    """Collects the visible text of an HTML document, blocks separated by blank lines."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping: list[str] = []

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in _SKIPPED:
            self.skipping.append(tag)
        elif tag in _BLOCKS and not self.skipping:
            self.parts.append("\n\n")

    def handle_startendtag(self, tag: str, attrs) -> None:
        if tag in _BLOCKS and not self.skipping:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if self.skipping and tag == self.skipping[-1]:
            self.skipping.pop()
        elif tag in _BLOCKS and not self.skipping:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def looks_like_html(text: str) -> bool:
    """Whether ``text`` carries HTML markup (a doctype, a comment or a common tag)."""
    return bool(_LOOKS_LIKE_HTML.search(text))


def html_to_text(markup: str) -> str:
    """The visible text of an HTML document: no tags, no script or style, entities decoded."""
    parser = _TextExtractor()
    parser.feed(markup)
    parser.close()
    # Leftover angle-bracket fragments (a tag cut off at the end of a feed) are dropped too.
    return re.sub(r"<[^<>]{0,200}>", " ", "".join(parser.parts))


def strip_link_targets(text: str) -> str:
    """``text`` with markdown link and image targets dropped (their text and alt text kept),
    autolinks kept only as http(s) addresses, and ``javascript:``/``vbscript:``/``data:`` URLs
    removed wherever they stand."""
    text = _MARKDOWN_LINK.sub(lambda m: m.group(1), text)
    text = _AUTOLINK.sub(
        lambda m: m.group(0)[1:-1] if m.group(1).lower() in _WEB_SCHEMES else " ", text
    )
    return _UNSAFE_URL.sub(" ", text)


def normalise_text(text: str | None) -> str:
    """The plain text a document is summarised from.

    HTML becomes its visible text (an ``<a href>`` keeps its text, never its target);
    entities are decoded; the text is Unicode NFC; invisible and control characters go; link
    targets go (:func:`strip_link_targets`); runs of spaces and single line breaks become one
    space; blank lines (and HTML blocks) become paragraph breaks, written as one blank line.

    Args:
        text: a document body as landed; None is treated as empty.

    Returns:
        paragraphs separated by ``"\\n\\n"``, each with single spaces, no leading or trailing
        whitespace.
    """
    if not text:
        return ""
    if looks_like_html(text):
        text = html_to_text(text)
    else:
        text = _ENTITY.sub(lambda m: html.unescape(m.group(0)), text)
    text = unicodedata.normalize("NFC", text).translate(_INVISIBLE)
    text = _CONTROL.sub(" ", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = strip_link_targets(text)
    paragraphs = (" ".join(p.split()) for p in _PARAGRAPH_BREAK.split(text))
    return "\n\n".join(p for p in paragraphs if p)
