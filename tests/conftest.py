"""Shared fixtures: a temporary data root and Dagster instance for every test that needs one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import boto3
import pytest
from dagster import DagsterInstance
from helpers import cpu_resources

from resources.storage import DataStore

# Worlds whose fixtures several modules request by name: the ECS tests' (PostgreSQL, moto, the
# daemon) and the interruptible day of the cost ledger and deadline tests.
pytest_plugins = ["aws_world", "rest_world", "tripled_world"]

FIXTURES = Path(__file__).parent / "fixtures"

# Modules whose tests must not overlap with each other under pytest-xdist (`make test` runs two
# workers): the UI tests share one `dagster dev` (a session fixture, built once per worker) and
# drive one browser; each Ray module starts a local Ray with every core of the machine. A group
# runs on one worker, in file order; under xdist the groups go out first, as the longest chains.
GROUPS = {"test_ui_": "ui", "test_ray_": "ray"}
# Modules that go to one worker whole: each builds a world once per module (a trained model, a
# landed history, PostgreSQL and a daemon) that xdist, handing out one test at a time, would
# build again on the other worker for the tests it got. Being larger units, they go out before
# the single tests, which then fill both workers to the end.
WHOLE = {
    "test_alert_rules",
    "test_alerts_and_commits",
    "test_backfill_consistency",
    "test_bad_inputs",
    "test_cli",
    "test_cost_ledger",
    "test_deadline_capacity",
    "test_deploy_aws",
    "test_document_chunks",
    "test_eval_promotion",
    "test_fraud_guard",
    "test_fraud_model",
    "test_generate",
    "test_landing_files",
    "test_landing_timezones",
    "test_no_retry_failures",
    "test_prometheus_metrics",
    "test_promotion",
    "test_quality",
    "test_shadow",
    "test_spot_faults",
    "test_staleness",
    "test_summaries",
    "test_summary_spans",
    "test_table_commits",
}
# Modules marked slow (`pytest -m "not slow"` leaves them out): each test starts the Dagster CLI,
# a daemon, dagster dev or Ray in subprocesses, or kills and resumes whole runs.
SLOW = (
    "test_ui_",
    "test_ray_",
    "test_cli",
    "test_deploy_aws",
    "test_deadline_capacity",
    "test_prometheus_metrics",
    "test_spot_faults",
    "test_table_commits",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test of a group with the group's name (``-m ui``, ``-m "not ray"``) and the
    tests of SLOW modules slow; under xdist, the groups go to the front, then the WHOLE
    modules, then the single tests (the scheduler hands them out in this order)."""
    for item in items:
        if group := _group(item):
            item.add_marker(getattr(pytest.mark, group))
        if item.path.name.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
    if hasattr(config, "workerinput"):  # an xdist worker; a plain run keeps file order
        items.sort(key=_dealt)  # stable: file order within each part


def _dealt(item: pytest.Item) -> int:
    """When a test goes out under xdist: the longest chains first, single tests last."""
    if _group(item):
        return 0
    return 1 if item.path.stem in WHOLE else 2


def _group(item: pytest.Item) -> str | None:
    return _group_of(item.path.name)


def _group_of(filename: str) -> str | None:
    return next((g for prefix, g in GROUPS.items() if filename.startswith(prefix)), None)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: `-p no:xdist` still runs
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup`` with the groups above and the WHOLE modules, read from each test's
    file name: xdist 3.8 tells the scheduler a test's group by renaming its node id, which
    pytest 9 ignores."""
    if config.getvalue("dist") != "loadgroup":
        return None
    # The collection's order (see pytest_collection_modifyitems), not xdist's largest-count-first:
    # a WHOLE module of many quick tests would otherwise go out before the UI and Ray chains.
    config.option.loadscopereorder = False
    from xdist.scheduler import LoadGroupScheduling

    class ModuleGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            filename = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
            if group := _group_of(filename):
                return group
            whole = filename.removesuffix(".py") in WHOLE
            return filename if whole else super()._split_scope(nodeid)

    return ModuleGroups(config, log)


@pytest.fixture
def data_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv("NIGHTSHIFT_DATA_ROOT", str(root))
    return root


@pytest.fixture(scope="session")
def s3_server():
    """A local S3-compatible server (moto) on loopback."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(params=["local", "s3"])
def any_store(request, tmp_path, monkeypatch) -> DataStore:
    """The same DataStore interface on a local folder and on an S3 bucket."""
    if request.param == "local":
        return DataStore(str(tmp_path / "data"))
    endpoint = request.getfixturevalue("s3_server")
    for key, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    bucket = f"nightshift-{tmp_path.name.lower().replace('_', '-')[-40:]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return DataStore(
        f"s3://{bucket}/prefix",
        s3_endpoint=endpoint,
        s3_region="us-east-1",
        # The test's own catalog: the bucket's name recurs from one pytest run to the next.
        catalog_uri=f"sqlite:///{tmp_path}/catalog.db",
    )


@pytest.fixture
def store(data_root: Path) -> DataStore:
    return DataStore(str(data_root))


@pytest.fixture
def dagster_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture
def instance(dagster_home: Path) -> DagsterInstance:
    with DagsterInstance.get() as inst:
        yield inst


@pytest.fixture
def resources(data_root: Path) -> dict:
    """The local resource map, pointed at the temporary data root, small batches on CPU."""
    return cpu_resources(data_root)


@pytest.fixture(scope="session")
def ui_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """`dagster dev` on loopback over demo data, with a fraud_scores backfill launched and the
    landing sensor started from the UI; shared by the GraphQL and browser tests, stopped after
    the last test that uses it (see ``pytest_runtest_teardown``)."""
    from ui_stack import dagster_dev, start_operating

    with ExitStack() as running:
        stack = running.enter_context(dagster_dev(tmp_path_factory.mktemp("ui")))
        start_operating(stack)
        _STOP_UI.append(running.close)
        yield stack


_STOP_UI: list[Callable[[], None]] = []


CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """Debian's Chromium driven by Playwright, for the UI modules; nothing is downloaded or
    installed here."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"Chromium is missing at {CHROMIUM}: install Debian's package "
            "(`make test` installs it: `bash deploy/local/install-browser.sh`); this test installs nothing"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def page(browser, ui_stack) -> Iterator:
    """A page of the browser on the shared `dagster dev`, once the UI's backfill has run."""
    from ui_stack import ARTIFACTS, wait_for_backfill

    wait_for_backfill(ui_stack, ui_stack.facts["backfill_id"], runs_only=True)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    ARTIFACTS.mkdir(exist_ok=True)
    yield page
    context.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """Stops the UI stack once its last user is torn down, not at the end of the session: its
    webserver and daemon would otherwise keep running beside every later test of the process.
    "Last" is over the whole collection, so under xdist only the worker that ran it stops it."""
    result = yield
    if _STOP_UI and item is _last_user(item.session, "ui_stack"):
        _STOP_UI.pop()()
    return result


def _last_user(session: pytest.Session, fixture: str) -> pytest.Item | None:
    return next((i for i in reversed(session.items) if fixture in i.fixturenames), None)


@pytest.fixture(scope="session")
def llama():
    """A tiny random Llama whose greedy output depends on its input (generation mechanics)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    # A large init scale makes the random model's greedy output depend on its input.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0)
    return model
