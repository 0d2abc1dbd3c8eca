import pytest
from omegaconf import OmegaConf

from gac.jobs.config.command_line import compose_config

# small and fast: few calibration samples, short windows, 20 items per task, a few latency iterations
QUICK = ["model=tiny", "gpu=cpu", "eval=quick", "eval.limit=20", "eval.ppl_seq_len=128", "eval.ppl_max_windows=8", "calibration.n_samples=4",
         "calibration.seq_len=128", "seq_len=64", "eval.latency_seq_lens=[64]"]


@pytest.fixture
def make_cfg(tmp_path):
    def make(*overrides, results_dir=None):
        cfg = compose_config([*QUICK, f"results_dir={results_dir or tmp_path / 'results'}", *overrides])
        return OmegaConf.to_container(cfg, resolve=True)

    return make
