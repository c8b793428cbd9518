"""The fraud day's cut into shards of whole accounts: the vectorised crc32 matches zlib's, the
day-wide figures match a brute-force count over the clean rows whatever the shard count, and a
day of one shard is held in memory, not written to scratch files."""

from __future__ import annotations

import zlib
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest

from inference.engine.quarantine import QuarantinePlan
from inference.fraud.accounts import AccountShards, account_shards, crc32_strings

STRINGS = ["", "a", "acct_000123", None, "ü€𝄞x", "zz" * 40, "acct_1", "ça"]


def _crc(value: str | None) -> int:
    return zlib.crc32(value.encode()) if value is not None else 0


def test_crc32_strings_is_zlibs_crc32_of_the_utf8_bytes():
    values = pa.array(STRINGS, pa.string())
    assert crc32_strings(values).tolist() == [_crc(v) for v in STRINGS]
    assert crc32_strings(values.slice(2, 4)).tolist() == [_crc(v) for v in STRINGS[2:6]]
    assert crc32_strings(pa.array([], pa.string())).tolist() == []


def test_ids_of_one_width_hash_to_zlibs_crc32_too():
    # The one-width path (a byte column at a time, no distinct ids first) against zlib, sliced
    # and multi-byte, and through account_shards.
    ids = [f"acct-{i:06d}" for i in np.random.default_rng(5).integers(0, 10**6, 2_000)]
    wide = ["ü€x", "abcdef", "ç𝄞"]  # 6 UTF-8 bytes each
    for values in (ids, wide, ["", ""]):
        array = pa.array(values, pa.string())
        assert crc32_strings(array).tolist() == [_crc(v) for v in values]
    assert crc32_strings(pa.array(ids).slice(7, 100)).tolist() == [_crc(v) for v in ids[7:107]]
    chunked = pa.chunked_array([pa.array(ids[:500]), pa.array(ids[500:])])
    assert account_shards(chunked, 5).tolist() == [_crc(v) % 5 for v in ids]


def test_account_shards_is_crc32_modulo_shards_with_null_ids_in_shard_0():
    rng = np.random.default_rng(7)
    ids = [f"acct_{i}" if i % 11 else None for i in rng.integers(0, 500, 3_000)]
    chunked = pa.chunked_array([pa.array(ids[:1_000]), pa.array(ids[1_000:])])
    for shards in (1, 4, 7):
        got = account_shards(chunked, shards)
        assert got.tolist() == [_crc(v) % shards for v in ids]


def _day(rows: int, batch_rows: int) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(3)
    accounts = [f"acct_{i}ü" if i % 5 else f"a{i}" for i in rng.integers(0, 300, rows)]
    merchants = [f"m{i}" for i in rng.integers(0, 40, rows)]
    countries = [["US", "FR", "JP"][i] for i in rng.integers(0, 3, rows)]
    table = pa.table({"account_id": accounts, "merchant_id": merchants, "country": countries})
    return table.to_batches(max_chunksize=batch_rows)


@pytest.mark.parametrize("shards", [1, 3, 8])
def test_day_figures_and_shards_are_exact_for_any_shard_count(shards):
    batches = _day(5_000, 700)
    rows = pa.Table.from_batches(batches).to_pylist()
    bad = np.array(sorted({3, 10, 999, 1_400, 4_999}), np.int64)
    plan = QuarantinePlan(len(rows), bad, np.full(len(bad), "bad", object))
    clean = [r for i, r in enumerate(rows) if i not in set(bad.tolist())]
    reach: dict[str, set] = defaultdict(set)
    for r in clean:
        reach[r["merchant_id"]].add(r["account_id"])

    cut = AccountShards(shards, plan)
    try:
        figures = cut.write(batches)
        written = list(cut.folder.iterdir())
        inputs = list(cut.inputs())
    finally:
        cut.close()

    assert figures.rows == len(clean)
    assert figures.merchants.to_pylist() == sorted(reach)
    assert figures.merchant_reach.tolist() == [len(reach[m]) for m in sorted(reach)]
    countries = sorted({r["country"] for r in clean})
    assert figures.countries.to_pylist() == countries
    assert figures.country_counts.tolist() == [
        sum(r["country"] == c for r in clean) for c in countries
    ]
    assert [s.index for s in inputs] == list(range(shards))
    assert len(written) == (0 if shards == 1 else shards)
    seen = np.concatenate([s.positions for s in inputs])
    assert sorted(seen.tolist()) == list(range(len(rows)))
    for s in inputs:
        assert np.all(np.diff(s.positions) > 0)
        assert s.rows.to_pylist() == [rows[p] for p in s.positions]
        assert {_crc(a) % shards for a in s.rows["account_id"].to_pylist()} <= {s.index}
