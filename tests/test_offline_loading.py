"""Model loads stay offline by their own arguments: no hub request, no environment change."""

import os
import socket
from collections.abc import Iterator, MutableMapping

import pytest
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from inference.engine.device import make_runtime
from inference.generation.generate import load_generator
from inference.text.embeddings import encode
from inference.text.encoder import load_sentence_encoder, packaged_encoder_path

RUNTIME = make_runtime("cpu", "fp32")


@pytest.fixture
def network_refused(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The hub in online mode, as with HF_HUB_OFFLINE unset, and every connection refused and
    noted: a load that asked the hub for anything is seen, whatever this run's environment."""
    import huggingface_hub.constants

    attempts: list[tuple] = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("this test allows no network")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    # huggingface_hub reads HF_HUB_OFFLINE once, at import; every later check reads this.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return attempts


class WatchedEnviron(MutableMapping):
    """``os.environ`` as it is, with every write and deletion noted by name."""

    def __init__(self, real: MutableMapping[str, str]) -> None:
        self.real, self.writes = real, []

    def __getitem__(self, name: str) -> str:
        return self.real[name]

    def __setitem__(self, name: str, value: str) -> None:
        self.writes.append(name)
        self.real[name] = value

    def __delitem__(self, name: str) -> None:
        self.writes.append(name)
        del self.real[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.real)

    def __len__(self) -> int:
        return len(self.real)

    def copy(self) -> dict[str, str]:
        return dict(self.real)


def watch_environ(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names written to ``os.environ`` from now on (a save-set-restore is seen too)."""
    watched = WatchedEnviron(os.environ)
    monkeypatch.setattr(os, "environ", watched)
    return watched.writes


def test_the_packaged_encoder_loads_with_no_hub_request_and_the_environment_untouched(
    network_refused, monkeypatch
) -> None:
    # The first load imports torch.compile's modules, which set TORCHINDUCTOR_CACHE_DIR once.
    load_sentence_encoder(RUNTIME)
    written = watch_environ(monkeypatch)

    encoder = load_sentence_encoder(RUNTIME)

    assert written == []
    assert network_refused == []
    assert encode(encoder, ["An offline sentence."], 256, 8).vectors.shape == (1, 384)


def test_a_checkpoint_folder_loads_with_no_hub_request_and_the_environment_untouched(
    network_refused, monkeypatch, tmp_path
) -> None:
    folder = tmp_path / "tiny-llama"
    tokenizer = AutoTokenizer.from_pretrained(packaged_encoder_path(), local_files_only=True)
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    load_generator(folder, RUNTIME)  # torch's one-time environment write, as above
    written = watch_environ(monkeypatch)

    generator = load_generator(folder, RUNTIME)

    assert written == []
    assert network_refused == []
    assert not generator.is_encoder_decoder and generator.tokenizer.padding_side == "left"
