"""CNN/DailyMail in See et al.'s ``finished_files/chunked/*.bin`` form, read without TensorFlow.

``make_datafiles.py`` (github.com/abisee/cnn-dailymail) writes each split as serialised
``tf.train.Example`` records, each prefixed by its length (8 bytes, native order), with two
bytes features: ``article`` (PTB tokens, lower-case) and ``abstract`` (the highlights, each
wrapped in ``<s> ... </s>``), then cuts them into chunks of 1,000 in the order of the split's
URL list. So chunk ``val_013.bin`` holds validation articles 13,000-13,367 and each record's id
is the sha1 of the URL at its position: that is how the sources are told apart later.

    python -m evaluation.cnn_dailymail_bins OUT.csv URLS.txt CHUNK.bin[:START] ...

writes the CSV layout ``evaluation.summaries`` reads (article, highlights one per line,
id), in the tokenised lower-case form only: the cased text is not in these files.
"""

from __future__ import annotations

import csv
import hashlib
import re
import struct
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

_SENTENCE = re.compile(r"<s> (.*?) </s>")


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _fields(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(field number, payload) of each length-delimited field of a protobuf message; the
    tf.Example layers used here have no other kind, and a varint field is skipped."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        if key & 7 == 2:
            size, i = _varint(data, i)
            yield key >> 3, data[i : i + size]
            i += size
        elif key & 7 == 0:
            _, i = _varint(data, i)
        else:
            raise ValueError(f"unexpected protobuf wire type {key & 7}")


def parse_example(record: bytes) -> dict[str, str]:
    """A tf.train.Example's bytes features, first value of each, as text."""
    out = {}
    for _, features in _fields(record):  # Example.features
        for _, entry in _fields(features):  # Features.feature map entries
            parts = dict(_fields(entry))  # 1: key, 2: Feature
            values = [
                v for f, blist in _fields(parts.get(2, b"")) if f == 1 for _, v in _fields(blist)
            ]
            out[parts[1].decode()] = values[0].decode() if values else ""
    return out


def read_chunk(path: Path) -> list[dict[str, str]]:
    """Every record of one chunk file, in order."""
    data, i, records = path.read_bytes(), 0, []
    while i < len(data):
        if i + 8 > len(data):
            raise ValueError(f"{path}: truncated length prefix at byte {i}")
        (size,) = struct.unpack("q", data[i : i + 8])
        if i + 8 + size > len(data):
            raise ValueError(f"{path}: record at byte {i} runs past the end of the file")
        records.append(parse_example(data[i + 8 : i + 8 + size]))
        i += 8 + size
    return records


def chunk_rows(path: Path, urls: Sequence[str], start: int) -> list[dict[str, str]]:
    """One chunk's articles as CSV rows, ids the sha1 of the URL at each record's position."""
    records = read_chunk(path)
    if start + len(records) > len(urls):
        raise ValueError(f"{path}: {len(records)} records from {start} exceed the URL list")
    rows = []
    for k, record in enumerate(records):
        highlights = _SENTENCE.findall(record.get("abstract", ""))
        if not record.get("article", "").strip() or not highlights:
            raise ValueError(f"{path}: record {k} has no article or no highlights")
        url = urls[start + k]
        rows.append(
            {
                "article": record["article"],
                "highlights": "\n".join(highlights),
                "id": hashlib.sha1(url.encode()).hexdigest(),
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, urls, chunks = Path(args[0]), Path(args[1]).read_text().split(), args[2:]
    rows = []
    for spec in chunks:
        name, _, start = spec.partition(":")
        path = Path(name)
        first = int(start) if start else 1000 * int(re.search(r"_(\d+)\.bin$", name).group(1))
        rows += chunk_rows(path, urls, first)
    with open(out, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, ["article", "highlights", "id"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"{out}: {len(rows)} articles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
