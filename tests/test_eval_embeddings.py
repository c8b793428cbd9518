"""The embeddings evaluation's retrieval figures, on similarity matrices with known answers."""

import numpy as np

from benchmarks.eval_embeddings import retrieval


def test_retrieval_scores_the_rank_of_each_querys_own_document() -> None:
    assert retrieval(np.eye(4)) == {"recall_at_1": 1.0, "recall_at_10": 1.0, "mrr": 1.0}
    # Query 0 ranks its document second, query 1 third, queries 2 and 3 first.
    similarity = np.array(
        [[0.5, 0.9, 0.1, 0.0], [0.8, 0.2, 0.7, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]]
    )
    assert retrieval(similarity) == {
        "recall_at_1": 0.5,
        "recall_at_10": 1.0,
        "mrr": round((1 / 2 + 1 / 3 + 1 + 1) / 4, 3),
    }
