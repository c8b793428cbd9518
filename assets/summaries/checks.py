"""Checks on the daily digest, which reads published summaries back.

The checks on documents and summaries are Great Expectations suites evaluated inside the assets
that produce them (see ``assets/summaries/gates.py``); a failing ERROR check there stops the
digest before it runs.
"""

from dagster import AssetCheckExecutionContext, AssetCheckResult, MetadataValue, asset_check

from assets.handed import READ, handed
from assets.summaries.digest import ASSET as DIGEST
from assets.summaries.digest import daily_digest
from assets.summaries.schemas import SUMMARIES
from resources.storage import StorageResource


def _dates(context: AssetCheckExecutionContext) -> list[str]:
    if not (context.has_partition_key or context.has_partition_key_range):
        raise ValueError(
            f"{context.check_specs[0].key.name} checks daily partitions: run it with the asset's "
            "partition (or range), not on its own"
        )
    return list(context.partition_keys)


@asset_check(asset=daily_digest, blocking=True)
def digest_covers_every_document(
    context: AssetCheckExecutionContext, storage: StorageResource
) -> AssetCheckResult:
    """Each summarised document sits in exactly one topic, and doc_count matches doc_ids."""
    store = storage.store()
    problems = {}
    for date in _dates(context):
        # The digest as its materialisation published it, and the summaries it was made from.
        pins = {
            **handed(context, store, [DIGEST], date),
            **handed(context, store, [DIGEST], date, READ),
        }
        with store.pinned(pins):
            summarised = store.read_output(SUMMARIES, date).column("doc_id").to_pylist()
            digest = store.read_output(DIGEST, date)
        in_topics = [d for ids in digest.column("doc_ids").to_pylist() for d in ids]
        counts_match = digest.column("doc_count").to_pylist() == [
            len(ids) for ids in digest.column("doc_ids").to_pylist()
        ]
        if sorted(in_topics) != sorted(summarised) or not counts_match:
            problems[date] = {
                "documents": len(summarised),
                "in_topics": len(in_topics),
                "distinct_in_topics": len(set(in_topics)),
                "doc_count_matches": counts_match,
            }
    return _result(problems)


def _result(problems: dict) -> AssetCheckResult:
    """Passes when no partition has a problem; the problems, by date, go into the metadata."""
    metadata = {"problems": MetadataValue.json(problems)}
    return AssetCheckResult(passed=not problems, metadata=metadata)
