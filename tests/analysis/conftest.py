import json
import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
STORE = FIXTURES / "store"
PROFILE = FIXTURES / "profile"


@pytest.fixture(scope="session")
def df():
    from gac.analysis import load_results

    return load_results(STORE)


@pytest.fixture
def store_copy(tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(STORE, dst)
    return dst


def with_task_files(store, value, keys=None):
    """The store's records (those whose key starts with one of ``keys``, default all) given ``model.task_files``
    ``value``, loaded: what a store of jobs scored on that task data holds (issue 30)."""
    from gac.analysis import load_results

    for f in (store / "records").glob("*.json"):
        if keys is None or f.name.startswith(tuple(keys)):
            rec = json.loads(f.read_text())
            rec["config"]["model"]["task_files"] = value
            f.write_text(json.dumps(rec))
    return load_results(store)
