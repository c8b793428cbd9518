"""docs/your-own-model.md's example end to end: examples/churn_scores.py over two landed days."""

import os
import re
import signal
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch
from dagster import Definitions, materialize
from helpers import asset_metadata, cpu_resources
from safetensors.torch import load_file, save_file

from examples import churn_scores as example
from examples.churn_scores import ASSET, CUSTOMERS, CUSTOMERS_SCHEMA, SCORES_SCHEMA, churn_mlp
from inference.checkpoints import CheckpointError, weights_version
from resources.inference import InferenceResource

DOC = Path(__file__).resolve().parents[1] / "docs" / "your-own-model.md"
DAYS = ["2026-03-01", "2026-03-02"]
GOOD = 600  # scorable customers a day; five more rows a day cannot be scored
BAD = {
    "null_customer_id": (None, 12.0, 50.0, 1.0),
    "null_tenure_months": ("c00900", None, 50.0, 1.0),
    "non_finite_monthly_spend": ("c00901", 12.0, float("nan"), 1.0),
    "non_finite_support_tickets": ("c00902", 12.0, 50.0, float("inf")),
    "duplicate_customer_id": ("c00003", 30.0, 80.0, 0.0),
}
CHECKS = {"row_count_matches_input", "churn_probabilities_in_unit_interval"}


def _land(store, date: str, seed: int) -> dict[str, tuple]:
    """Lands a day of customers with one bad row of each kind; returns the good rows by id."""
    rng = np.random.default_rng(seed)
    good = [
        (f"c{i:05d}", rng.uniform(0, 72), rng.uniform(10, 150), float(rng.integers(0, 10)))
        for i in range(GOOD)
    ]
    rows = list(good)
    for at, row in zip((5, 100, 250, 400, 590), BAD.values(), strict=True):
        rows.insert(at, row)
    columns = list(zip(*rows, strict=True))
    store.write_landing(CUSTOMERS, date, pa.table(columns, schema=CUSTOMERS_SCHEMA))
    return {row[0]: row[1:] for row in good}


@pytest.fixture
def landed(store) -> dict[str, dict[str, tuple]]:
    return {date: _land(store, date, seed) for seed, date in enumerate(DAYS)}


@pytest.fixture
def weights(tmp_path) -> Path:
    """A random churn MLP saved as the doc says: save_file(model.state_dict(), path)."""
    torch.manual_seed(0)
    path = tmp_path / "models" / "churn_mlp.safetensors"
    path.parent.mkdir()
    save_file(churn_mlp().state_dict(), path)
    return path


def _run(resources, instance, model_path, day=DAYS[0], **config):
    tags = {}
    if day is None:  # the two-day range, as one run
        tags = {
            "dagster/asset_partition_range_start": DAYS[0],
            "dagster/asset_partition_range_end": DAYS[-1],
        }
    return materialize(
        [example.customers, example.churn_scores],
        partition_key=day,
        tags=tags,
        run_config={"ops": {ASSET: {"config": {"model_path": str(model_path), **config}}}},
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )


def _expected(good: dict[str, tuple], weights: Path) -> dict[str, float]:
    """What the model says for each scorable customer, computed here without the runner."""
    net = churn_mlp()
    net.load_state_dict(load_file(weights))
    with torch.no_grad():
        p = torch.sigmoid(net(torch.tensor(list(good.values()), dtype=torch.float32)))
    return dict(zip(good, p.squeeze(1).tolist(), strict=True))


def _assert_day(store, result, day: str, good: dict[str, tuple], weights: Path) -> dict:
    scores = store.read_output(ASSET, day)
    assert scores.schema.equals(SCORES_SCHEMA)
    ids, probabilities = scores["customer_id"], scores["churn_probability"]
    got = dict(zip(ids.to_pylist(), probabilities.to_pylist(), strict=True))
    assert scores.num_rows == len(got) == GOOD  # one row per good customer, none twice
    expected = _expected(good, weights)
    assert got.keys() == expected.keys()
    assert np.allclose([got[k] for k in expected], list(expected.values()), atol=1e-6)
    assert all(0.0 <= p <= 1.0 for p in got.values())
    assert set(scores["model_version"].to_pylist()) == {weights_version(weights)}

    quarantined = store.read_output(f"{ASSET}_quarantine", day)
    assert Counter(quarantined["reason"].to_pylist()) == dict.fromkeys(BAD, 1)
    assert set(quarantined.column_names) >= {*CUSTOMERS_SCHEMA.names, "row_number", "reason"}

    meta = asset_metadata(result, ASSET, day)
    assert meta["dagster/row_count"] == meta["rows_out"] == GOOD
    assert meta["rows_in"] == GOOD + len(BAD) and meta["rows_quarantined"] == len(BAD)
    assert meta["quarantine_reasons"] == dict.fromkeys(BAD, 1)
    assert meta["model_version"] == weights_version(weights) and meta["model_loads"] == 1
    assert meta["likely_to_churn"] == sum(p >= 0.5 for p in got.values())
    assert meta["output"].endswith(f"date={day}")
    checks = [c for c in result.get_asset_check_evaluations() if c.partition == day]
    assert {c.check_name for c in checks} == CHECKS and all(c.passed for c in checks)
    return meta


def test_one_day_scores_every_good_customer_and_quarantines_the_rest(
    landed, store, resources, instance, weights
):
    result = _run(resources, instance, weights)
    assert result.success
    meta = _assert_day(store, result, DAYS[0], landed[DAYS[0]], weights)
    assert meta["partitions"] == 1
    assert not store.output_exists(ASSET, DAYS[1])


def test_a_range_backfill_records_each_day_and_loads_the_model_once(
    landed, store, resources, instance, weights
):
    result = _run(resources, instance, weights, day=None)
    assert result.success
    for day in DAYS:
        assert _assert_day(store, result, day, landed[day], weights)["partitions"] == 2


def test_an_interrupted_day_resumes_from_its_finished_shards(
    landed, store, data_root, instance, weights
):
    # Shards of 200 rows in model calls of 100: the day is four shards; SIGUSR1 (the scheduler
    # wants the node back) arrives during the third model call, and the step retries in place.
    resources = cpu_resources(data_root, max_batch_size=100, shard_rows=200)
    calls = []

    def interrupt_once(module, inputs, output):
        if isinstance(module, torch.nn.Sequential):
            calls.append(1)
            if len(calls) == 3:
                os.kill(os.getpid(), signal.SIGUSR1)

    hook = torch.nn.modules.module.register_module_forward_hook(interrupt_once)
    try:
        result = _run(resources, instance, weights)
    finally:
        hook.remove()
    assert result.success
    meta = _assert_day(store, result, DAYS[0], landed[DAYS[0]], weights)
    assert (meta["interruptions"], meta["soft_interruptions"]) == (1, 1)
    assert meta["shards_resumed"] == 1 and meta["shards"] == 4


def test_a_pickled_weights_file_is_refused_with_how_to_convert_it(
    landed, store, resources, instance, weights
):
    pickled = weights.with_suffix(".pt")
    torch.save(churn_mlp().state_dict(), pickled)
    result = _run(resources, instance, pickled)
    assert not result.success and not store.output_exists(ASSET, DAYS[0])
    [failure] = result.get_step_failure_events()
    assert failure.step_failure_data.error.cls_name == "Failure"  # not retried
    message = failure.step_failure_data.error.message
    assert "holds pickled weights" in message
    # Converting as the message says gives a file that scores.
    exec(re.search(r'python -c "(.+?)"', message).group(1), {})
    assert _run(resources, instance, pickled.with_suffix(".safetensors")).success


def test_too_many_bad_rows_fail_the_day_and_publish_nothing(
    landed, store, resources, instance, weights
):
    # Five bad rows of 605 (0.83%) are within the default floor of 10 rows: without it, the
    # 0.10% share fails the day.
    result = _run(resources, instance, weights, max_quarantine_rate=0.001, quarantine_floor_rows=0)
    assert not result.success and not store.output_exists(ASSET, DAYS[0])
    [failure] = result.get_step_failure_events()
    assert "above the 0.10% quarantine limit; nothing was published" in (
        failure.step_failure_data.error.message
    )


def _doc_block(after: str) -> str:
    """The first fenced code block of the doc after the line ``after``."""
    text = DOC.read_text()
    return re.search(r"```\w*\n(.*?)```", text[text.index(after) :], re.S).group(1)


def test_the_docs_hugging_face_loader_loads_safetensors_and_refuses_pickles(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    namespace = dict(vars(example))
    exec(_doc_block("## A Hugging Face checkpoint folder"), namespace)
    load, inference = namespace["load"], InferenceResource(device="cpu")
    tiny = BertConfig(
        vocab_size=64, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
        intermediate_size=8, num_labels=2,
    )  # fmt: skip
    folder = tmp_path / "ticket-sentiment"
    BertForSequenceClassification(tiny).save_pretrained(folder)
    model = load(None, inference, SimpleNamespace(model_path=str(folder)))
    assert model.version.startswith("ticket-sentiment@")
    assert model.value.config.num_labels == 2 and inference.load_count(model.key) == 1

    (folder / "model.safetensors").unlink()
    torch.save(model.value.state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as refused:
        load(None, inference, SimpleNamespace(model_path=str(folder)))
    # The doc quotes the real message, for a folder at /models/ticket-sentiment.
    quoted = str(refused.value).replace(str(folder), "/models/ticket-sentiment")
    assert quoted in " ".join(DOC.read_text().split())


def test_the_doc_names_the_example_and_quotes_the_pickled_file_refusal(tmp_path):
    Definitions.validate_loadable(example.defs)  # `dagster ... -m examples.churn_scores` loads
    text = " ".join(DOC.read_text().split())
    assert "examples/churn_scores.py" in text and "tests/test_your_own_model.py" in text
    pickled = tmp_path / "churn_mlp.pt"
    pickled.write_bytes(b"")
    with pytest.raises(CheckpointError) as refused:
        weights_version(pickled)
    assert str(refused.value).replace(str(tmp_path), "/models") in text
