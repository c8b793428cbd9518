"""Long documents in chunks: cuts at sentence ends, pooling, and embed_documents with the real MiniLM."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from inference.engine.device import make_runtime
from inference.text.chunks import Chunking, chunk_tokens, sentence_ends
from inference.text.embeddings import document_chunks, embed_documents, encode, pool_chunks
from inference.text.encoder import load_sentence_encoder

LEAD = (
    "The city council approved a new budget for the harbour on Monday. "
    "Officials said repairs to the old pier would begin in the spring. "
)
TAIL_A = "Later the mayor praised the volunteers who cleaned the beaches after the storm. "
TAIL_B = "Later a court fined the shipping company for dumping oil into the river delta. "


@pytest.fixture(scope="module")
def encoder():
    return load_sentence_encoder(make_runtime("cpu", "fp32"))


def _words(encoder, text: str) -> int:
    return len(encoder.tokenizer(text, add_special_tokens=False)["input_ids"])


def test_sentence_ends_follow_final_marks_and_closers_not_abbreviations() -> None:
    text = 'He said "stop." Then U.S. forces left! Why? ok'
    offsets = [(0, 2), (3, 7), (8, 9), (9, 13), (13, 14), (14, 15), (16, 20)]
    offsets += [(21, 22), (22, 23), (23, 24), (24, 25), (26, 32), (33, 37), (37, 38)]
    offsets += [(39, 42), (42, 43), (44, 46)]
    ends = sentence_ends(text, offsets)
    # '."' ends the quoted sentence (at the closer, not the period); 'U.' and 'S' do not, the
    # period of "U.S." before a space does (a cut there is harmless); '!' and '?' do.
    assert [text[a:b] for (a, b), e in zip(offsets, ends, strict=True) if e] == ['"', ".", "!", "?"]


@pytest.mark.parametrize("size", [8, 13, 40])
def test_chunks_cover_the_document_in_order_within_the_window(size: int) -> None:
    ids = list(range(100))
    ends = [i % 7 == 6 for i in ids]  # a sentence every 7 tokens
    chunks = chunk_tokens(ids, ends, size, max_chunks=100)
    assert [t for c in chunks for t in c] == ids
    assert all(1 <= len(c) <= size for c in chunks)
    # Every chunk but the last ends at a sentence end when one lies in its window's second half.
    for chunk in chunks[:-1]:
        if any(ends[t] for t in chunk[size // 2 :]) or len(chunk) < size:
            assert ends[chunk[-1]]


def test_chunks_stop_at_max_chunks_and_an_empty_document_is_one_empty_chunk() -> None:
    ids = list(range(50))
    chunks = chunk_tokens(ids, [False] * 50, 10, max_chunks=2)
    assert chunks == [ids[:10], ids[10:20]]
    assert chunk_tokens([], [], 10, max_chunks=2) == [[]]


def test_chunking_names_its_method_and_rejects_nonsense() -> None:
    # The chunks alone, then with the hashed words the default adds (a new version by design).
    assert Chunking(256, 2, 0.5, terms=None).describe() == "chunks256x2-decay0.5"
    assert Chunking(256, 2, 0.5).describe() == "chunks256x2-decay0.5+hashed-terms1024-w0.5"
    assert Chunking(256, 3, 0.5).weights(3) == [1.0, 0.5, 0.25]
    assert Chunking().dimension(384) == 384 + 1024
    assert Chunking(terms=None).dimension(384) == 384
    bad_settings = [{"window": 2}, {"max_chunks": 0}, {"decay": 0.0}, {"decay": 1.5}]
    bad_settings += [{"terms_weight": 0.0}, {"terms_weight": 1.0}]
    for bad in bad_settings:
        with pytest.raises(ValueError):
            Chunking(**bad)


def test_pooling_weights_chunks_and_ignores_the_other_documents() -> None:
    vectors = torch.nn.functional.normalize(
        torch.randn(6, 4, generator=torch.manual_seed(0)), dim=1
    )
    chunking = Chunking(256, 2, 0.5)
    pooled = pool_chunks(vectors, [3, 1, 2], chunking)
    expected = torch.nn.functional.normalize(vectors[0] + 0.5 * vectors[1], dim=0)
    assert torch.allclose(pooled[0], expected) and torch.allclose(pooled[1], vectors[3])
    # A document's vector is the same bits whatever else is pooled with it.
    assert torch.equal(pool_chunks(vectors[4:], [2], chunking)[0], pooled[2])


def test_chunks_fit_the_encoders_window_and_a_wider_one_is_refused(encoder) -> None:
    text = (LEAD * 40).strip()
    [chunks] = document_chunks(encoder, [text], Chunking(encoder.max_length, 3))
    assert len(chunks) == 3 and all(len(c) <= encoder.max_length for c in chunks)
    cls, sep = encoder.tokenizer.cls_token_id, encoder.tokenizer.sep_token_id
    assert all(c[0] == cls and c[-1] == sep for c in chunks)
    # Each chunk ends at a sentence: the text of every chunk but the last ends with a period.
    assert all(encoder.tokenizer.decode(c[1:-1]).endswith(".") for c in chunks)
    with pytest.raises(ValueError, match="exceed"):
        document_chunks(encoder, [text], Chunking(encoder.max_length + 1))


def test_a_long_documents_vector_depends_on_text_beyond_the_first_window(encoder) -> None:
    lead = LEAD * 12
    assert _words(encoder, lead) > encoder.max_length  # the tails start beyond the first window
    a, b = lead + TAIL_A * 4, lead + TAIL_B * 4
    before = encode(encoder, [a, b], 2048, 64).vectors
    assert torch.equal(before[0], before[1])  # the first window alone cannot tell them apart
    chunking = Chunking(encoder.max_length, 2, 0.5)
    after = embed_documents(encoder, [a, b], chunking, 2048, 64).vectors
    assert float(after[0] @ after[1]) < 0.999
    # The encoder does not read text past the chunks kept; only the hashed words do (the whole
    # document's words are cheap to count, so the default reads them all).
    far = lead * 3
    c, d = far + TAIL_A, far + TAIL_B
    sentences = replace(chunking, terms=None)
    assert torch.equal(*embed_documents(encoder, [c, d], sentences, 2048, 64).vectors)
    both = embed_documents(encoder, [c, d], chunking, 2048, 64).vectors
    assert torch.equal(both[0, :384], both[1, :384]) and not torch.equal(both[0], both[1])


@pytest.mark.parametrize("words", [1, 30, 40_000])
def test_short_and_very_long_documents_get_one_unit_vector_each(encoder, words: int) -> None:
    text = " ".join(["harbour"] * words) + "."
    texts = [text, "A short second document.", text]
    embedded = embed_documents(encoder, texts, Chunking(encoder.max_length), 2048, 64)
    vectors = embedded.vectors.numpy()
    # The sentence vector's 384 dimensions, then the 1,024 hashed-word buckets.
    assert vectors.shape == (3, 384 + 1024) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    assert np.array_equal(vectors[0], vectors[2])
    assert embedded.model_calls >= 1
    # A text within one window is one chunk, framed exactly as the tokenizer frames it.
    [short] = document_chunks(encoder, [texts[1]], Chunking(encoder.max_length))
    assert short == [encoder.tokenizer(texts[1])["input_ids"]]


def test_hashed_words_follow_the_pooled_sentence_vector_at_their_weights(encoder) -> None:
    texts = [LEAD * 12 + TAIL_A, "Harbour pier repairs begin in spring.", "the of and"]
    hybrid = Chunking(encoder.max_length, 2, 0.5)
    dense = embed_documents(encoder, texts, replace(hybrid, terms=None), 2048, 64).vectors
    both = embed_documents(encoder, texts, hybrid, 2048, 64).vectors
    terms = torch.from_numpy(hybrid.terms.vectors(texts))
    w = hybrid.terms_weight
    assert torch.allclose(both[:2, :384], dense[:2] * (1 - w) ** 0.5, atol=1e-6)
    assert torch.allclose(both[:2, 384:], terms[:2] * w**0.5, atol=1e-6)
    # Stop words only: no hashed words, so the vector is the sentence vector alone, unit norm.
    assert not torch.any(both[2, 384:]) and torch.allclose(both[2, :384], dense[2], atol=1e-6)
    # A dot product weighs the sentence cosine and the bag-of-words cosine as configured.
    expected = (1 - w) * float(dense[0] @ dense[1]) + w * float(terms[0] @ terms[1])
    assert abs(float(both[0] @ both[1]) - expected) < 1e-5
