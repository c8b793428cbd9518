"""The model registry on the model store: champion and challenger aliases, their history, URIs."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from inference.models.modelstore import ModelNotFoundError, load_model, save_model
from inference.models.registry import (
    CHALLENGER,
    CHAMPION,
    FIRST_VERSION_REASON,
    ModelUri,
    alias_history,
    challenger_version,
    champion_on,
    champion_version,
    parse_model_uri,
    promote,
    register,
    resolve,
    trained_window,
    window_of,
)
from resources.storage import DataStore


def _register(store: DataStore, weight: float, dates: list[str]) -> tuple[str, str]:
    manifest = {"features": ["a"], "trained_window": window_of(dates)}
    tensors = {"w": torch.full((2,), weight)}
    return register(
        store.read_bytes, store.write_bytes, store.models_dir, "m", tensors, manifest, by="tester"
    )


def test_first_version_is_champion_and_a_retrain_is_challenger(store: DataStore) -> None:
    read, models = store.read_bytes, store.models_dir
    with pytest.raises(ModelNotFoundError, match="has not been trained"):
        champion_version(read, models, "m")
    first, alias = _register(store, 1.0, ["2026-11-01", "2026-11-02"])
    assert alias == CHAMPION and champion_version(read, models, "m") == first
    assert challenger_version(read, models, "m") is None
    second, alias = _register(store, 2.0, ["2026-11-02", "2026-11-03"])
    assert alias == CHALLENGER and second != first
    # The retrain waits: the champion, and what load_model loads by default, are unchanged.
    assert champion_version(read, models, "m") == first
    assert challenger_version(read, models, "m") == second
    assert load_model(read, models, "m").version == first
    # Retraining to the champion's own content moves nothing.
    assert _register(store, 1.0, ["2026-11-01", "2026-11-02"]) == (first, CHAMPION)

    promote(read, store.write_bytes, models, "m", second, by="ana", reason="better", forced=True)
    assert champion_version(read, models, "m") == second
    assert challenger_version(read, models, "m") is None
    history = alias_history(read, models, "m")
    assert [(c.alias, c.version) for c in history] == [
        (CHAMPION, first),
        (CHALLENGER, second),
        (CHAMPION, second),
        (CHALLENGER, None),
    ]
    assert history[0].reason == FIRST_VERSION_REASON and history[0].by == "tester"
    assert history[2].forced and history[2].by == "ana" and history[2].reason == "better"
    assert all(c.at.endswith("+00:00") for c in history)


def test_champion_on_a_day_follows_the_history(store: DataStore) -> None:
    first, _ = _register(store, 1.0, ["2026-11-01"])
    today = alias_history(store.read_bytes, store.models_dir, "m")[0].at[:10]
    assert champion_on(store.read_bytes, store.models_dir, "m", today) == first
    assert champion_on(store.read_bytes, store.models_dir, "m", "2000-01-01") is None


def test_a_store_older_than_aliases_reads_current_as_champion(store: DataStore) -> None:
    version = save_model(store.write_bytes, store.models_dir, "m", {"w": torch.ones(1)}, {})
    store.write_bytes(f"{store.models_dir}/m/CURRENT", version.encode())
    assert champion_version(store.read_bytes, store.models_dir, "m") == version
    assert alias_history(store.read_bytes, store.models_dir, "m") == []
    assert resolve(store.read_bytes, store.models_dir, "models:/m@champion") == version


def test_promoting_a_version_never_saved_is_refused(store: DataStore) -> None:
    with pytest.raises(ModelNotFoundError, match="no version deadbeef"):
        promote(store.read_bytes, store.write_bytes, store.models_dir, "m", "deadbeef")


@pytest.mark.parametrize(
    ("uri", "parsed"),
    [
        ("models:/fraud_model@champion", ModelUri("fraud_model", alias="champion")),
        ("models:/fraud_model@challenger", ModelUri("fraud_model", alias="challenger")),
        ("models:/fraud_model/3f2a9c", ModelUri("fraud_model", version="3f2a9c")),
    ],
)
def test_model_uris_parse_as_mlflow_writes_them(uri: str, parsed: ModelUri) -> None:
    assert parse_model_uri(uri) == parsed


def test_a_malformed_uri_says_what_was_expected() -> None:
    with pytest.raises(ValueError, match="models:/<name>@<alias>"):
        parse_model_uri("fraud_model@champion")


@pytest.mark.parametrize(
    ("manifest", "window"),
    [
        (
            {"trained_window": {"from": "2026-11-01", "through": "2026-11-28"}},
            ("2026-11-01", "2026-11-28"),
        ),
        ({"trained_on": {"dates": ["2026-11-03", "2026-11-01"]}}, ("2026-11-01", "2026-11-03")),
        (
            {"trained_on": {"first_date": "2026-11-01", "last_date": "2026-11-05"}},
            ("2026-11-01", "2026-11-05"),
        ),
        ({"features": []}, None),
    ],
)
def test_trained_window_reads_new_and_older_manifests(manifest: dict, window) -> None:
    assert trained_window(manifest) == window


def _two_saved_versions(store: DataStore) -> list[str]:
    manifest = {"features": ["a"], "trained_window": window_of(["2026-11-01"])}
    return [
        save_model(store.write_bytes, store.models_dir, "m", {"w": torch.full((2,), w)}, manifest)
        for w in (2.0, 3.0)
    ]


def _promote_both_at_once(store: DataStore, versions: list[str], read, cas) -> list[Exception]:
    errors: list[Exception] = []

    def move(version: str) -> None:
        try:
            promote(read, store.write_bytes, store.models_dir, "m", version, by=version,
                    reason="race", forced=True, cas=cas)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=move, args=(v,)) for v in versions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return errors


def test_two_promotions_at_once_keep_both_moves_in_the_history(any_store: DataStore) -> None:
    """Each move holds the name's lease from reading the history to writing the pointer."""
    store = any_store
    first, _ = _register(store, 1.0, ["2026-11-01"])
    versions = _two_saved_versions(store)

    def slow(path: str) -> bytes:  # a move that dawdles between reading and writing
        data = store.read_bytes(path)
        if path.endswith("/aliases.json"):
            time.sleep(0.3)
        return data

    assert _promote_both_at_once(store, versions, slow, store.cas()) == []
    history = alias_history(store.read_bytes, store.models_dir, "m")
    champions = [c.version for c in history if c.alias == CHAMPION]
    assert champions[0] == first and sorted(champions[1:]) == sorted(versions)
    # The pointer names the move recorded last.
    assert champion_version(store.read_bytes, store.models_dir, "m") == champions[-1]
    assert not store.exists(f"{store.models_dir}/m/_aliases.lease")


def test_without_the_lease_two_promotions_at_once_lose_a_move(store: DataStore) -> None:
    """What the lease prevents: both moves read the history before either writes it."""
    _register(store, 1.0, ["2026-11-01"])
    versions = _two_saved_versions(store)
    both_read = threading.Barrier(2, timeout=30)

    def interleaved(path: str) -> bytes:
        data = store.read_bytes(path)
        if path.endswith("/aliases.json"):
            both_read.wait()
        return data

    assert _promote_both_at_once(store, versions, interleaved, None) == []
    history = alias_history(store.read_bytes, store.models_dir, "m")
    assert len([c for c in history if c.alias == CHAMPION]) == 2  # one of the two moves is lost


def test_a_move_waits_for_one_in_progress_and_says_so_when_it_never_ends(
    store: DataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import inference.models.registry as registry

    _register(store, 1.0, ["2026-11-01"])
    (second,) = _two_saved_versions(store)[:1]
    monkeypatch.setattr(registry, "LOCK_WAIT_SECONDS", 0.3)
    with registry.aliases_locked(store.cas(), store.models_dir, "m"):
        with pytest.raises(registry.AliasesBusyError, match="aliases of model 'm'"):
            promote(store.read_bytes, store.write_bytes, store.models_dir, "m", second,
                    by="b", reason="r", forced=True, cas=store.cas())  # fmt: skip
    promote(store.read_bytes, store.write_bytes, store.models_dir, "m", second, by="b",
            reason="r", forced=True, cas=store.cas())  # fmt: skip
    assert champion_version(store.read_bytes, store.models_dir, "m") == second
