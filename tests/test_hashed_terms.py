"""The hashed bag of words beside the sentence vector: content words, weights, hashing, stability."""

import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from inference.text.lexical import HashedTerms, words

TEXTS = [
    "Storm Ciara closed the Severn Bridge on Sunday; 40,000 homes lost power.",
    "The Severn Bridge reopened after Storm Ciara, and power came back to 40,000 homes.",
    "A chef in Lyon won a third Michelin star for his bouillabaisse.",
]


def test_words_are_lower_case_content_words_with_numbers_and_inner_apostrophes() -> None:
    assert words("The U.S. Army's O'Neill said 40,000 troops WON'T leave.") == [
        "u",
        "army's",
        "o'neill",
        "40",
        "000",
        "troops",
        "won't",
        "leave",
    ]
    assert words("and the of it was") == []


def _exact_cosine(a: str, b: str) -> float:
    def weights(text: str) -> dict[str, float]:
        return {w: 1 + math.log(c) for w, c in Counter(words(text)).items()}

    wa, wb = weights(a), weights(b)
    dot = sum(v * wb.get(w, 0.0) for w, v in wa.items())
    return dot / math.sqrt(sum(v * v for v in wa.values()) * sum(v * v for v in wb.values()))


def test_a_wide_table_gives_the_exact_bag_of_words_cosine() -> None:
    # With far more buckets than words, no two words of these texts share one.
    vectors = HashedTerms(1 << 20).vectors(TEXTS)
    assert vectors.shape == (3, 1 << 20) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    for i, j in ((0, 1), (0, 2), (1, 2)):
        assert abs(float(vectors[i] @ vectors[j]) - _exact_cosine(TEXTS[i], TEXTS[j])) < 1e-5
    assert float(vectors[0] @ vectors[1]) > 0.4 and abs(float(vectors[0] @ vectors[2])) < 1e-6


def test_repeats_count_sublinearly_and_case_and_stop_words_do_not_count() -> None:
    terms = HashedTerms(1 << 20)
    once, thrice, shouted = terms.vectors(
        ["harbour pier", "harbour harbour harbour pier", "The HARBOUR and a PIER"]
    )
    assert np.allclose(once, shouted)
    # 1 + log 3 against 1: the repeated word leads, but not three to one.
    slots = np.flatnonzero(thrice)
    assert sorted(np.abs(thrice[slots]) / np.abs(thrice[slots]).min()) == pytest.approx(
        [1.0, 1 + math.log(3)]
    )


def test_a_text_without_content_words_is_all_zeros_and_none_is_empty() -> None:
    terms = HashedTerms(64)
    vectors = terms.vectors(["", "the of and", TEXTS[0]])
    assert not vectors[:2].any() and abs(float(np.linalg.norm(vectors[2])) - 1.0) < 1e-6
    assert terms.vectors([]).shape == (0, 64)
    with pytest.raises(ValueError, match="at least 1 bucket"):
        HashedTerms(0)


def test_a_vector_depends_only_on_its_text_and_not_on_the_process() -> None:
    terms = HashedTerms(1024)
    alone = terms.vectors([TEXTS[0]])[0]
    assert np.array_equal(alone, terms.vectors(TEXTS[::-1])[2])
    # Python's str hash is salted per process; the buckets must not be, or stored vectors
    # would stop matching tomorrow's queries.
    code = (
        "import sys, numpy as np; from inference.text.lexical import HashedTerms; "
        f"sys.stdout.buffer.write(HashedTerms(1024).vectors([{TEXTS[0]!r}]).tobytes())"
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
            cwd=Path(__file__).resolve().parent.parent,
        ).stdout
        assert np.array_equal(np.frombuffer(out, np.float32), alone)
