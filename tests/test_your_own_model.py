"""docs/your-own-model.md's example end to end: examples/churn_scores.py over two landed days."""

import ast
import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from churn_world import BAD, DAYS, GOOD, assert_day, land, run
from dagster import AssetKey, DagsterInstance, Definitions
from helpers import cpu_resources
from safetensors.torch import save_file

from assets.day_metadata import day_figures
from examples import churn_scores as example
from examples.churn_scores import ASSET, churn_mlp
from inference.generation.checkpoints import CheckpointError, weights_version

TESTS = Path(__file__).resolve().parent
DOC = TESTS.parent / "docs" / "your-own-model.md"


@pytest.fixture
def landed(store) -> dict[str, dict[str, tuple]]:
    return {date: land(store, date, seed) for seed, date in enumerate(DAYS)}


@pytest.fixture
def weights(tmp_path) -> Path:
    """A random churn MLP saved as the doc says: save_file(model.state_dict(), path)."""
    torch.manual_seed(0)
    path = tmp_path / "models" / "churn_mlp.safetensors"
    path.parent.mkdir()
    save_file(churn_mlp().state_dict(), path)
    return path


def test_one_day_scores_every_good_customer_and_quarantines_the_rest(
    landed, store, resources, instance, weights
):
    result = run(resources, instance, weights)
    assert result.success
    meta = assert_day(store, result, DAYS[0], landed[DAYS[0]], weights)
    assert meta["partitions"] == 1
    assert not store.output_exists(ASSET, DAYS[1])


def test_a_range_backfill_records_each_day_and_loads_the_model_once(
    landed, store, resources, instance, weights
):
    result = run(resources, instance, weights, day=None)
    assert result.success
    for day in DAYS:
        assert assert_day(store, result, day, landed[day], weights)["partitions"] == 2


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
        result = run(resources, instance, weights)
    finally:
        hook.remove()
    assert result.success
    meta = assert_day(store, result, DAYS[0], landed[DAYS[0]], weights)
    assert (meta["interruptions"], meta["soft_interruptions"]) == (1, 1)
    assert meta["shards_resumed"] == 1 and meta["shards"] == 4


def test_a_pickled_weights_file_is_refused_with_how_to_convert_it(
    landed, store, resources, instance, weights
):
    pickled = weights.with_suffix(".pt")
    torch.save(churn_mlp().state_dict(), pickled)
    result = run(resources, instance, pickled)
    assert not result.success and not store.output_exists(ASSET, DAYS[0])
    [failure] = result.get_step_failure_events()
    assert failure.step_failure_data.error.cls_name == "Failure"  # not retried
    message = failure.step_failure_data.error.message
    assert "holds pickled weights" in message
    # Converting as the message says gives a file that scores.
    exec(re.search(r'python -c "(.+?)"', message).group(1), {})
    assert run(resources, instance, pickled.with_suffix(".safetensors")).success


def test_too_many_bad_rows_fail_the_day_and_publish_nothing(
    landed, store, resources, instance, weights
):
    # Five bad rows of 605 (0.83%) are within the default floor of 10 rows: without it, the
    # 0.10% share fails the day.
    result = run(resources, instance, weights, max_quarantine_rate=0.001, quarantine_floor_rows=0)
    assert not result.success and not store.output_exists(ASSET, DAYS[0])
    [failure] = result.get_step_failure_events()
    assert "above the 0.10% quarantine limit; nothing was published" in (
        failure.step_failure_data.error.message
    )


def _doc_block(after: str) -> str:
    """The first fenced code block of the doc after the line ``after``."""
    text = DOC.read_text()
    return re.search(r"```\w*\n(.*?)```", text[text.index(after) :], re.S).group(1)


def test_the_docs_hugging_face_predictor_scores_and_refuses_pickles(tmp_path):
    import pyarrow as pa
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    namespace = dict(vars(example))
    exec(_doc_block("## A Hugging Face checkpoint folder"), namespace)
    predictor = namespace["TicketSentiment"]
    tiny = BertConfig(
        vocab_size=64, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
        intermediate_size=8, num_labels=2,
    )  # fmt: skip
    folder = tmp_path / "ticket-sentiment"
    BertForSequenceClassification(tiny).save_pretrained(folder)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "late", "refund"]))
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(folder)
    model = predictor(model_path=str(folder))
    assert model.version().startswith("ticket-sentiment@")
    model.device = "cpu"
    model.load("cpu")
    answered = model(pa.record_batch({"text": ["late refund", "refund", "late late late"]}))
    assert len(answered["negative"]) == 3 and all(0 <= p <= 1 for p in answered["negative"])

    (folder / "model.safetensors").unlink()
    torch.save(model.model.state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as refused:
        predictor(model_path=str(folder)).version()
    # The doc quotes the real message, for a folder at /models/ticket-sentiment.
    quoted = str(refused.value).replace(str(folder), "/models/ticket-sentiment")
    assert quoted in " ".join(DOC.read_text().split())


def test_the_example_is_one_page_on_one_module() -> None:
    """Issue 45: at most 40 lines, importing at most 6 project names, all from one module."""
    source = Path(example.__file__).read_text()
    assert len(source.splitlines()) <= 40
    project = {"nightshift", "assets", "inference", "resources", "orchestration", "policy"}
    imported = [
        (node.module, alias.name)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] in project
        for alias in node.names
    ]
    plain = [
        alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.split(".")[0] in project
    ]
    assert not plain and len(imported) <= 6 and len({m for m, _ in imported}) == 1, imported


def test_the_doc_names_the_example_and_quotes_the_pickled_file_refusal(tmp_path):
    Definitions.validate_loadable(example.defs)  # `dagster ... -m examples.churn_scores` loads
    text = " ".join(DOC.read_text().split())
    assert "examples/churn_scores.py" in text and "tests/test_your_own_model.py" in text
    pickled = tmp_path / "churn_mlp.pt"
    pickled.write_bytes(b"")
    with pytest.raises(CheckpointError) as refused:
        weights_version(pickled)
    assert str(refused.value).replace(str(tmp_path), "/models") in text


def test_the_example_runs_as_its_own_job_killed_mid_day_and_run_again(
    landed, store, data_root, weights, tmp_path
):
    """The example as a fifth pipeline, through `dagster job execute`: killed (SIGKILL) after
    two of its four shards, nothing is published; run again, it resumes those two and publishes
    each good customer once and each bad row in quarantine with its reason (issue 45). The
    example has no code for any of this."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "NIGHTSHIFT_DATA_ROOT": str(data_root),
        "PYTHONPATH": os.pathsep.join([str(TESTS / "fault_site"), str(TESTS.parent)]),
    }
    config = {
        "ops": {ASSET: {"config": {"model_path": str(weights)}}},
        "resources": {"inference": {"config": {"shard_rows": 200, "max_batch_size": 100}}},
    }
    run_config = tmp_path / "run_config.yaml"
    run_config.write_text(json.dumps(config))  # JSON is YAML
    command = [
        str(Path(sys.executable).parent / "dagster"), "job", "execute",
        "-m", "examples.churn_scores", "-j", "churn_scores_job",
        "--tags", json.dumps({"dagster/partition": DAYS[0]}), "--config", str(run_config),
    ]  # fmt: skip
    killed = subprocess.run(
        command, env={**env, "NIGHTSHIFT_TEST_FAULT": "kill@shard:2"}, capture_output=True,
        text=True, timeout=300, cwd=TESTS.parent,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:] + killed.stderr[-3000:]
    assert not store.output_exists(ASSET, DAYS[0])

    again = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300, cwd=TESTS.parent
    )
    # A blocking check that failed (row_count_matches_input among them) would fail the run.
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    scores = store.read_output(ASSET, DAYS[0])
    ids = scores["customer_id"].to_pylist()
    assert sorted(ids) == sorted(landed[DAYS[0]]) and len(set(ids)) == len(ids)  # each once
    quarantined = store.read_output(f"{ASSET}_quarantine", DAYS[0])
    assert Counter(quarantined["reason"].to_pylist()) == dict.fromkeys(BAD, 1)
    with DagsterInstance.from_config(str(home)) as instance:
        [record] = instance.fetch_materializations(AssetKey(ASSET), limit=1).records
    meta = day_figures(record.asset_materialization.metadata)
    assert meta["rows_in"] == meta["rows_out"] + meta["rows_quarantined"] == GOOD + len(BAD)
    assert (meta["shards"], meta["shards_resumed"]) == (4, 2), meta


def test_the_examples_own_landing_trigger_asks_for_a_landed_day(landed, data_root) -> None:
    """`nightly` also builds the pipeline's landing sensor: a landed day no run has read asks
    for one run of the pipeline's job for that day."""
    from dagster import build_sensor_context

    from resources.storage import StorageResource

    [sensor] = example.defs.sensors
    with DagsterInstance.ephemeral() as instance:
        context = build_sensor_context(
            instance=instance,
            resources={"storage": StorageResource(data_root=str(data_root))},
            repository_def=example.defs.get_repository_def(),
        )
        requests = sensor(context).run_requests
    assert [(r.job_name, r.partition_key) for r in requests] == [
        ("churn_scores_job", day) for day in DAYS
    ]


def test_a_pipelines_demo_day_is_generated_once_its_wiring_is_listed(tmp_path, monkeypatch):
    import assets.domains
    from nightshift import Landing, Output, nightly
    from orchestration.cli import generate
    from resources.storage import DataStore

    def demo(store, date: str, scale: float, seed: int) -> dict[str, int]:
        return {example.CUSTOMERS: len(land(store, date, seed)) + len(BAD)}

    churn = nightly(
        "churn_demo_scores",
        example.ChurnModel,
        Landing(example.CUSTOMERS, example.CUSTOMERS_SCHEMA, key="customer_id"),
        Output(example.SCORES),
        demo=demo,
    )
    assert churn.wiring.demo_day is demo
    monkeypatch.setattr(assets.domains, "DOMAINS", (churn.wiring,))  # its one line there
    store = DataStore(str(tmp_path / "data"))
    written = generate(store, DAYS[-1], len(DAYS), 1.0, 0)
    assert written == [(example.CUSTOMERS, date, GOOD + len(BAD)) for date in DAYS]
    assert store.landing_dates(example.CUSTOMERS) == DAYS
