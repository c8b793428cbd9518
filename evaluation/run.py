"""`make eval`: quality of all four pipelines on real public data, beside the textbook baselines.

- fraud: the committed ULB card-transaction sample, nightshift's model against logistic
  regression (AUPRC, ROC-AUC over five seeded 70/30 splits), and an amount sweep
  (evaluation/fraud.py);
- recommendations: MovieLens 100k replayed as daily interactions through the real assets,
  against popularity, item-kNN and EASE (evaluation/recommendations.py);
- summaries: every k-th article of six CNN/DailyMail sets (validation and test, cased and
  tokenised lower-case; none of the reported articles tuned or trained on), against Lead-3,
  over all of them and with CNN and Daily Mail apart (evaluation/summaries.py);
- embeddings: highlight-to-article retrieval over the first 1,000 CNN/DailyMail validation
  articles, the asset's vectors against the sentence encoder alone and TF-IDF, with docs/s
  (evaluation/embeddings.py).

The last two data sets may not be redistributed, so they live in the git-ignored
``.nightshift/eval/`` cache, checked against their sha256; a missing one is reported with the
way to get it, and the other tables (and the summaries sets that are there) are still
printed. Exit status 1 if any was missing.

    .venv/bin/python -m evaluation.run [--only fraud recommendations summaries embeddings]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence


def _fraud() -> str:
    from evaluation import fraud as eval_fraud

    return eval_fraud.table(eval_fraud.evaluate())


def _recommendations() -> str:
    from evaluation import recommendations as eval_recommendations

    return eval_recommendations.table(eval_recommendations.evaluate())


class PartlyMissing(FileNotFoundError):
    """Some of a domain's data sets are not in the cache: the tables of those that are, and
    how to get the rest."""

    def __init__(self, tables: str, missing: Sequence[str]):
        super().__init__("\n".join(missing))
        self.tables = tables


def _summaries() -> str:
    from evaluation import summaries as eval_summaries

    missing: list[str] = []
    rows = eval_summaries.report(missing=missing)
    if missing:
        raise PartlyMissing(eval_summaries.table(rows) if rows else "", missing)
    return eval_summaries.table(rows)


def _embeddings() -> str:
    from evaluation import embeddings as eval_embeddings

    return eval_embeddings.report()


DOMAINS: dict[str, Callable[[], str]] = {
    "fraud": _fraud,
    "recommendations": _recommendations,
    "summaries": _summaries,
    "embeddings": _embeddings,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(DOMAINS), default=list(DOMAINS))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    missing = []
    for name in args.only:
        started = time.perf_counter()
        print(f"## {name}\n", flush=True)
        try:
            print(DOMAINS[name]())
        except FileNotFoundError as error:  # a data set not in the cache: say how to get it
            missing.append(name)
            if isinstance(error, PartlyMissing) and error.tables:
                print(error.tables + "\n")
            print(f"SKIPPED: {error}")
        print(f"\n({time.perf_counter() - started:.0f} s)\n", flush=True)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
