"""Shared fixtures, and the two trees' markers. `local_ray`: one small local Ray per test module.
Database fixtures: `ledger_url` runs a test on SQLite and on PostgreSQL.

Every test under ``tests/e2e`` is marked ``e2e`` and ``slow`` here, from its folder, and so is the
PostgreSQL case of a test run on both databases: ``pytest -m "not slow"`` is the fast tier. Shared
helpers are in ``tests/support.py``.

PostgreSQL is the real server at 127.0.0.1:5432 (override with DAPO_TEST_POSTGRES_URL); each
test gets a fresh database `dapo_test_<hex>`, dropped afterwards. If the server is unreachable
the PostgreSQL cases are skipped, or fail when DAPO_REQUIRE_POSTGRES=1 (CI).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from support import restore_environment

E2E = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the end-to-end tree's tests `e2e` and `slow` (real Ray, `dapo-ablate` processes, training),
    and the PostgreSQL case of every test run on both databases `slow`: the fast tier runs those on
    SQLite (each PostgreSQL case creates and drops its own database), the whole suite on both."""
    for item in items:
        if E2E in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.slow)
        elif item.get_closest_marker("postgres") is not None:
            item.add_marker(pytest.mark.slow)


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C works in this process and in the processes it starts, however the suite was started.
    A shell starts a background job (or one under nohup) with SIGINT ignored, which every child
    inherits; the tests that send SIGINT (to themselves, or to a `dapo-ablate run` they start, as a
    terminal's Ctrl-C does) would then wait out their sleeps and fail. With a handler in place here,
    the processes the tests start get SIGINT's default back at exec, as from a terminal."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


RAY_AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@pytest.fixture(autouse=True)
def ray_auth_restored() -> Iterator[None]:
    """Ray's authentication variables as they were before each test, and Ray's cached copy of them
    read again when they changed: a test that joins a token cluster in this process
    (`ray_connect.enable_token` sets ``RAY_AUTH_MODE=token``) leaves the next test of its worker
    the environment it found."""
    before = {name: os.environ.get(name) for name in RAY_AUTH_VARIABLES}
    yield
    if all(os.environ.get(name) == value for name, value in before.items()):
        return
    restore_environment(before)
    if "ray" in sys.modules:  # Ray caches the mode and the token: read them again
        from dapo_ablate.ablation.runtime.ray_connect import refresh_ray_auth

        refresh_ray_auth()


@pytest.fixture(scope="module")
def local_ray(request: pytest.FixtureRequest) -> Iterator[None]:
    """One small local Ray for the requesting module, whose functions (its cheap cell functions),
    and those of every test module it imported (`support`'s, a fast part's), travel to Ray's workers
    by value: by reference the workers would have to import the test modules. A module's
    ``LOCAL_RAY_GPUS`` declares that many (logical) GPUs, as a GPU machine's Ray has: a verl run's
    job is placed on them before it starts (`Backend.prepare`)."""
    import ray

    from dapo_ablate.ablation.runtime.ray_connect import start_local

    for module in test_modules(request.module):
        ray.cloudpickle.register_pickle_by_value(module)
    # the product's local start: tried again when Ray's fixed 30 s raylet wait passes on a busy machine
    gpus = {"num_gpus": request.module.LOCAL_RAY_GPUS} if hasattr(request.module, "LOCAL_RAY_GPUS") else {}
    start_local(2, 100 * 2**20, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, **gpus)
    yield
    ray.shutdown()


def test_modules(requesting: ModuleType) -> list[ModuleType]:
    """The requesting test module and every loaded module from the tests' folders (not the package)."""
    tests = Path(__file__).resolve().parent
    loaded = [module for module in list(sys.modules.values())
              if module is not requesting and tests in Path(getattr(module, "__file__", None) or "/").resolve().parents]
    return [requesting, *loaded]


POSTGRES_ADMIN_URL = os.environ.get(
    "DAPO_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(scope="session")
def postgres_admin() -> Iterator[Engine]:
    """An AUTOCOMMIT engine on the test server (CREATE DATABASE refuses transactions)."""
    engine = create_engine(
        POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
    )
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except OperationalError as err:
        engine.dispose()
        where = make_url(POSTGRES_ADMIN_URL).render_as_string(hide_password=True)
        reason = str(err.orig).strip().splitlines()[0]
        message = f"PostgreSQL at {where} is unreachable ({reason})"
        if os.environ.get("DAPO_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{message} and DAPO_REQUIRE_POSTGRES=1")
        pytest.skip(f"{message}; set DAPO_REQUIRE_POSTGRES=1 to make this a failure")
    yield engine
    engine.dispose()


@contextmanager
def fresh_postgres_database(admin: Engine, prefix: str) -> Iterator[str]:
    """Create database `<prefix>_<hex>` on the test server, yield its URL, drop it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(
            hide_password=False
        )
    finally:
        with admin.connect() as connection:  # FORCE: ends connections a test leaked
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def postgres_url(postgres_admin: Engine) -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped after the test."""
    with fresh_postgres_database(postgres_admin, "dapo_test") as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A URL of an empty ledger database: a SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def postgres_mlflow_url(postgres_admin: Engine) -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database `dapo_mlflow_<hex>` for an MLflow store."""
    with fresh_postgres_database(postgres_admin, "dapo_mlflow") as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def mlflow_uri(request: pytest.FixtureRequest, tmp_path) -> str:
    """An MLflow tracking URI of an empty store: a SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'mlflow.db'}"
    return request.getfixturevalue("postgres_mlflow_url")
