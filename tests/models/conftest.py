from tests.jobs.conftest import make_cfg  # noqa: F401 - the jobs' config fixture (tiny, quick evaluation)
