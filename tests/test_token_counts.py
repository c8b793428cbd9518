"""Tokens of text model days: the new tokens a generation day produced and the input tokens an
encoder's day (embeddings, extractive summaries) read, counted per model call, in the day's
metadata (tokens, tokens_per_second) and in the pushed nightshift_tokens_total."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from dagster import materialize
from helpers import asset_metadata, cpu_resources
from test_first_token_metrics import abstractive_day
from test_generate import DOCS, LIMITS, checkpoints  # noqa: F401 - the tiny checkpoints fixture
from test_run_metrics import _samples, _value, gateway  # noqa: F401 - the recording Pushgateway
from transformers import LlamaForCausalLM, T5ForConditionalGeneration

from assets.documents.assets import documents
from assets.documents.demo_data import generate_day
from assets.embeddings.document_embeddings import document_embeddings
from assets.summaries.document_summaries import document_summaries
from inference.engine.device import make_runtime
from inference.generation.generate import (
    CAUSAL_PROMPT,
    SEQ2SEQ_PROMPT,
    generate_summaries,
    load_generator,
)
from inference.text.encoder import load_sentence_encoder

DAY = "2026-03-02"
MODELS = {"seq2seq": T5ForConditionalGeneration, "causal": LlamaForCausalLM}


@pytest.fixture(scope="module")
def ending(checkpoints, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:  # noqa: F811
    """Copies of the tiny checkpoints whose end-of-sequence token is one their greedy output
    reaches part-way through some documents and not others: a random model need not ever
    write its own, and a batch's requests must end at different steps for padding to show."""
    root = tmp_path_factory.mktemp("ending")
    out = {}
    for kind, path in checkpoints.items():
        generator = load_generator(path, make_runtime("cpu", "fp32"))
        template = SEQ2SEQ_PROMPT if generator.is_encoder_decoder else CAUSAL_PROMPT
        reached: Counter[int] = Counter()
        for doc in DOCS:
            ids = generator.tokenizer(template.replace("{text}", doc), return_tensors="pt")
            with torch.inference_mode():
                tokens = generator.model.generate(
                    **ids, max_new_tokens=24, do_sample=False, num_beams=1, eos_token_id=None
                )
            start = 1 if generator.is_encoder_decoder else ids["input_ids"].shape[1]
            reached.update(set(tokens[0, start + 1 :].tolist()))
        # The token reached by the number of documents nearest half of them.
        token = min(reached, key=lambda t: abs(reached[t] - len(DOCS) / 2))
        assert 0 < reached[token] < len(DOCS)
        model = type(generator.model).from_pretrained(path)
        model.config.eos_token_id = model.generation_config.eos_token_id = token
        out[kind] = root / path.name
        shutil.copytree(path, out[kind])
        model.save_pretrained(out[kind])
    return out


class GenerateCalls:
    """Records the inputs of every ``generate`` call of a model class, and counts the tokens
    each of their requests produces when generated alone: a request of one row has no padding
    and stops at its end-of-sequence token, so its output's new columns are all its own."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cls: type) -> None:
        self.generate, self.calls = cls.generate, []
        self.seq2seq = cls is T5ForConditionalGeneration

        def recording(model, **kwargs):
            out = self.generate(model, **kwargs)
            self.calls.append((model, kwargs, out))
            return out

        monkeypatch.setattr(cls, "generate", recording)

    def tokens_alone(self) -> int:
        total = 0
        for model, kwargs, _ in self.calls:
            settings = {k: v for k, v in kwargs.items() if k not in ("input_ids", "attention_mask")}
            settings.pop("stopping_criteria", None)
            for ids, mask in zip(kwargs["input_ids"], kwargs["attention_mask"], strict=True):
                own = ids[mask.bool()][None, :]
                with torch.inference_mode():
                    out = self.generate(
                        model, input_ids=own, attention_mask=torch.ones_like(own), **settings
                    )
                total += out.shape[1] - (1 if self.seq2seq else own.shape[1])
        return total

    def padded_columns(self) -> int:
        """New columns of every batch's output rows: what counting the padding written after
        the requests that ended before their batch's last would give."""
        total = 0
        for _, kwargs, out in self.calls:
            start = 1 if self.seq2seq else kwargs["input_ids"].shape[1]
            total += out.shape[0] * (out.shape[1] - start)
        return total


@pytest.mark.parametrize("kind", ["seq2seq", "causal"])
def test_a_generation_call_counts_each_requests_new_tokens_not_its_padding(
    ending,
    kind,
    monkeypatch,
):
    generator = load_generator(ending[kind], make_runtime("cpu", "fp32"))
    calls = GenerateCalls(monkeypatch, MODELS[kind])
    # Long enough that some requests end before the longest of their batch.
    limits = LIMITS | {"max_new_tokens": 24, "max_batch_size": 4}

    out = generate_summaries(generator, DOCS, **limits)

    assert len(calls.calls) == len(out.batch_sizes) > 1
    expected = calls.tokens_alone()
    assert out.tokens == expected
    assert len(DOCS) <= expected < calls.padded_columns()


def test_a_generation_day_records_and_pushes_the_tokens_it_generated(
    ending,
    gateway,  # noqa: F811
    monkeypatch,
    store,
    data_root,
    instance,
) -> None:
    generate_day(store, DAY, scale=0.05)
    calls = GenerateCalls(monkeypatch, T5ForConditionalGeneration)
    result = abstractive_day(DAY, data_root, instance, ending["seq2seq"], 12, gateway)
    assert result.success
    meta = asset_metadata(result, "document_summaries")
    assert meta["batch_count"] > 2
    assert meta["tokens"] == calls.tokens_alone() < calls.padded_columns()
    assert meta["tokens_per_second"] > 0

    final = _samples(gateway.requests[-1][2])  # type: ignore[attr-defined]
    day = {"asset": "document_summaries", "partition": DAY}
    assert _value(final, "nightshift_tokens_total", **day) == meta["tokens"]
    assert _value(final, "nightshift_tokens_per_second", **day) > 0


# An encoder's days: the embeddings, and the summaries in their default (extractive) mode.
ENCODED = {
    "document_embeddings": (document_embeddings, {"max_quarantine_rate": 0.2}),
    "document_summaries": (document_summaries, {"mode": "extractive"}),
}


@pytest.mark.parametrize("asset", list(ENCODED))
def test_an_encoder_day_records_and_pushes_the_tokens_it_encoded(
    asset,
    gateway,  # noqa: F811
    monkeypatch,
    store,
    data_root,
    instance,
) -> None:
    generate_day(store, DAY, scale=0.05)
    # The day's encoder is loaded where its shards run: every forward call of its class has
    # its attention mask summed as the model receives it.
    cls = type(load_sentence_encoder(make_runtime("cpu", "fp32")).model)
    forward, masks = cls.forward, []

    def counting(model, *args, **kwargs):
        masks.append(int(kwargs["attention_mask"].sum()))
        return forward(model, *args, **kwargs)

    monkeypatch.setattr(cls, "forward", counting)
    url = f"http://127.0.0.1:{gateway.server_address[1]}"
    scoring, config = ENCODED[asset]
    result = materialize(
        [documents, scoring],
        partition_key=DAY,
        resources=cpu_resources(data_root, metrics_pushgateway=url, metrics_push_seconds=0.01),
        instance=instance,
        run_config={"ops": {asset: {"config": config}}},
    )
    assert result.success
    meta = asset_metadata(result, asset)
    assert masks and meta["tokens"] == sum(masks)
    assert meta["tokens_per_second"] > 0

    final = _samples(gateway.requests[-1][2])  # type: ignore[attr-defined]
    day = {"asset": asset, "partition": DAY}
    assert _value(final, "nightshift_tokens_total", **day) == meta["tokens"]
