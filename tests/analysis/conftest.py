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
