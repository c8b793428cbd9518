"""Abstractive summaries: tiny random seq2seq and causal checkpoints built offline, and the asset's mode."""

import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from dagster import materialize
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
)

from assets.day_metadata import day_entries
from assets.documents.assets import documents
from assets.documents.demo_data import BOILERPLATE, TOPICS, generate_day
from assets.documents.schemas import DOCUMENTS_SCHEMA
from assets.summaries.document_summaries import document_summaries
from inference.engine.device import make_runtime
from inference.generation.checkpoints import safetensors_folder
from inference.generation.decoding import static_sizing
from inference.generation.generate import (
    CheckpointError,
    check_checkpoint,
    checkpoint_version,
    generate_summaries,
    load_generator,
)

DAY = "2026-03-02"
SENTENCES = [s for topic in TOPICS.values() for s in topic["sentences"]] + BOILERPLATE
DOCS = [" ".join(SENTENCES[i : i + 1 + (i * 7) % 15]) for i in range(12)]
LIMITS = {
    "max_new_tokens": 6,
    "max_input_tokens": 128,
    "max_batch_tokens": 400,
    "max_batch_size": 8,
}


def _tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer trained here on the demo vocabulary: nothing is downloaded."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
    tokenizer.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=special))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="[PAD]",
        unk_token="[UNK]",
        bos_token="[BOS]",
        eos_token="[EOS]",
    )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    tokenizer = _tokenizer()
    size = tokenizer.vocab_size
    torch.manual_seed(0)
    # A large init scale makes the random model's greedy output depend on its input.
    seq2seq = T5ForConditionalGeneration(
        T5Config(
            vocab_size=size,
            d_model=32,
            d_ff=64,
            d_kv=8,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            pad_token_id=0,
            eos_token_id=3,
            decoder_start_token_id=0,
            initializer_factor=8.0,
        )
    )
    causal = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=3,
        )
    )
    paths = {"seq2seq": root / "tiny-t5", "causal": root / "tiny-llama"}
    for kind, model in (("seq2seq", seq2seq), ("causal", causal)):
        model.save_pretrained(paths[kind])
        tokenizer.save_pretrained(paths[kind])
    return paths


def _pickle_only(source: Path, target: Path) -> Path:
    """A copy of a checkpoint whose weights are a pickled ``pytorch_model.bin`` only, as
    ``save_pretrained(safe_serialization=False)`` wrote them before transformers 5."""
    shutil.copytree(source, target)
    state = T5ForConditionalGeneration.from_pretrained(source).state_dict()
    torch.save(state, target / "pytorch_model.bin")
    (target / "model.safetensors").unlink()
    return target


@pytest.fixture(scope="module")
def pickled_checkpoint(checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _pickle_only(checkpoints["seq2seq"], tmp_path_factory.mktemp("pickled") / "tiny-t5")


@pytest.mark.parametrize(
    ("kind", "cls"), [("seq2seq", T5ForConditionalGeneration), ("causal", LlamaForCausalLM)]
)
def test_model_class_follows_the_checkpoint_config(checkpoints, kind, cls):
    generator = load_generator(checkpoints[kind], make_runtime("cpu", "fp32"))
    assert isinstance(generator.model, cls)
    assert generator.is_encoder_decoder == (kind == "seq2seq")
    assert generator.tokenizer.padding_side == ("right" if kind == "seq2seq" else "left")
    assert generator.version == checkpoint_version(checkpoints[kind])
    assert generator.version.startswith(checkpoints[kind].name + "@")


@pytest.mark.parametrize("kind", ["seq2seq", "causal"])
def test_greedy_bucketed_generation_is_deterministic_and_in_input_order(checkpoints, kind):
    generator = load_generator(checkpoints[kind], make_runtime("cpu", "fp32"))
    first = generate_summaries(generator, DOCS, **LIMITS)
    again = generate_summaries(generator, DOCS, **LIMITS)
    assert len(first.texts) == len(DOCS)
    assert all(first.texts)
    assert first.texts == again.texts
    assert len(first.batch_sizes) > 1 and sum(first.batch_sizes) == len(DOCS)
    assert max(first.batch_sizes) <= LIMITS["max_batch_size"]
    # Each document generated alone (no padding) gives the same text: bucketing and padding
    # change neither the result nor which document it is returned for.
    alone = [generate_summaries(generator, [doc], **LIMITS).texts[0] for doc in DOCS]
    assert first.texts == alone
    assert len(set(first.texts)) > 1


class OneRowDevice(torch.nn.Module):
    """Generates like a device with room for one document per call: more raise the CUDA
    out-of-memory error, the type torch raises on a GPU."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.rows = model, []

    def generate(self, input_ids, **kwargs):
        self.rows.append(len(input_ids))
        if len(input_ids) > 1:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory ({len(input_ids)} rows)")
        return self.model.generate(input_ids=input_ids, **kwargs)


@pytest.mark.parametrize("kind", ["seq2seq", "causal"])
def test_static_summaries_back_off_on_out_of_memory_to_the_same_texts(checkpoints, kind):
    generator = load_generator(checkpoints[kind], make_runtime("cpu", "fp32"))
    expected = generate_summaries(generator, DOCS, **LIMITS).texts
    device = OneRowDevice(generator.model)

    got = generate_summaries(replace(generator, model=device), DOCS, **LIMITS)

    assert got.texts == expected
    assert sum(got.batch_sizes) == len(DOCS) and max(got.batch_sizes) == 1
    sizing = static_sizing(device, LIMITS["max_batch_tokens"])
    assert sizing.ooms == sum(r > 1 for r in device.rows) >= 1
    assert static_sizing(generator.model, LIMITS["max_batch_tokens"]).ooms == 0


def test_missing_checkpoint_is_reported_clearly(tmp_path: Path):
    with pytest.raises(CheckpointError, match="needs checkpoint_path"):
        check_checkpoint(None)
    with pytest.raises(CheckpointError, match="no config.json"):
        check_checkpoint(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="nowhere does not exist"):
        check_checkpoint(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="holds no model weights"):
        check_checkpoint(tmp_path)


def test_pickled_only_checkpoint_is_refused_without_unpickling(pickled_checkpoint, monkeypatch):
    def no_unpickling(*args, **kwargs):
        raise AssertionError("a pickled checkpoint was loaded")

    monkeypatch.setattr(torch, "load", no_unpickling)
    for load in (check_checkpoint, lambda p: load_generator(p, make_runtime("cpu", "fp32"))):
        with pytest.raises(CheckpointError) as refused:
            load(pickled_checkpoint)
        message = str(refused.value)
        assert str(pickled_checkpoint) in message
        assert "pickled weights only (pytorch_model.bin)" in message
        assert "from transformers import AutoModelForSeq2SeqLM as M" in message
        assert "safe_serialization=True" in message


def test_converting_as_the_refusal_says_gives_the_same_summaries(
    checkpoints, pickled_checkpoint, tmp_path
):
    folder = shutil.copytree(pickled_checkpoint, tmp_path / "tiny-t5")
    with pytest.raises(CheckpointError) as refused:
        check_checkpoint(folder)
    command = re.search(r'python -c "(.+?)"', str(refused.value)).group(1)
    exec(command, {})

    assert check_checkpoint(folder) == folder
    runtime = make_runtime("cpu", "fp32")
    converted = generate_summaries(load_generator(folder, runtime), DOCS, **LIMITS)
    original = generate_summaries(load_generator(checkpoints["seq2seq"], runtime), DOCS, **LIMITS)
    assert converted.texts == original.texts and all(converted.texts)


@pytest.mark.parametrize("weights", ["pytorch_model.bin", "model.pt", "weights.ckpt"])
def test_other_pickled_weight_files_are_refused_and_safetensors_accepted(tmp_path, weights):
    (tmp_path / weights).write_bytes(b"not opened")
    with pytest.raises(CheckpointError, match=rf"pickled weights only \({re.escape(weights)}\)"):
        safetensors_folder(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert safetensors_folder(tmp_path) == tmp_path


def test_abstractive_mode_summarises_every_document(checkpoints, store, resources, instance):
    generate_day(store, DAY, scale=0.02)
    config = {
        "mode": "abstractive",
        "checkpoint_path": str(checkpoints["seq2seq"]),
        "max_new_tokens": 6,
    }
    result = materialize(
        [documents, document_summaries],
        partition_key=DAY,
        resources=resources,
        instance=instance,
        run_config={"ops": {"document_summaries": {"config": config}}},
    )
    assert result.success
    published = store.read_output("document_summaries", DAY)
    landed = store.read_landing("documents", DAY, DOCUMENTS_SCHEMA)
    assert published["doc_id"].to_pylist() == landed["doc_id"].to_pylist()
    assert all(published["summary"].to_pylist())
    assert set(published["model_version"].to_pylist()) == {
        checkpoint_version(checkpoints["seq2seq"])
    }
    metadata = day_entries(result.asset_materializations_for_node("document_summaries")[0].metadata)
    assert metadata["mode"].value == "abstractive"
    assert metadata["model_loads"].value == 1 and metadata["oom_backoffs"].value == 0


def test_abstractive_mode_without_checkpoint_fails_and_publishes_nothing(
    store, resources, instance
):
    generate_day(store, DAY, scale=0.02)
    result = materialize(
        [document_summaries],
        partition_key=DAY,
        resources=resources,
        instance=instance,
        run_config={"ops": {"document_summaries": {"config": {"mode": "abstractive"}}}},
        raise_on_error=False,
    )
    assert not result.success
    message = "\n".join(
        e.event_specific_data.error.to_string() for e in result.get_step_failure_events()
    )
    assert "CheckpointError" in message and "needs checkpoint_path" in message
    assert result.get_step_failure_events()[0].event_specific_data.error.cls_name == "Failure"
    assert not store.output_exists("document_summaries", DAY)


def test_abstractive_mode_with_pickled_checkpoint_fails_at_once_and_publishes_nothing(
    pickled_checkpoint, store, resources, instance
):
    generate_day(store, DAY, scale=0.02)
    config = {"mode": "abstractive", "checkpoint_path": str(pickled_checkpoint)}
    result = materialize(
        [document_summaries],
        partition_key=DAY,
        resources=resources,
        instance=instance,
        run_config={"ops": {"document_summaries": {"config": config}}},
        raise_on_error=False,
    )
    assert not result.success
    error = result.get_step_failure_events()[0].event_specific_data.error
    assert error.cls_name == "Failure"
    assert "pickled weights only" in error.message and "save_pretrained(" in error.message
    assert not store.output_exists("document_summaries", DAY)
