"""The identity check: what a job computes on ``tiny`` is what the code computed when the fixture was made, to the last
digit. Table 5's five points (the baseline; ASVD and LLM-Pruner, unaligned and gac) and the six compressor /
allocation pairs (each compressor's own rule, and ASVD with gac's proportional rule) run through the real job; their
record keys, plans, compression reports and metrics are compared with ``identity_tiny.json``, which was written by
this file's ``__main__`` from the code before the job's recipe was rewritten (never typed by hand).

Latency and every time taken (``*_s``: the solver's, the plan's) are left out (a timing is never the same twice);
everything else a record says about the model is compared.

    python tests/jobs/test_identity.py   # rewrites the fixture: only when a change of results is intended

The fixture was written by main at 59a6153 on the project's 2-core CPU machine (torch 2.13, its default threads).
Floats to the last digit are a property of one machine and torch build: on another, write the fixture from the base
commit there first, then run the test on the change (slow tier: about 6 minutes alone).
"""

import json
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).with_name("identity_tiny.json")

# small and deterministic: few calibration samples, short windows, a few task items, no latency
SETTINGS = ["model=tiny", "gpu=cpu", "eval=quick", "eval.latency=false", "eval.limit=10", "eval.ppl_seq_len=128",
            "eval.ppl_max_windows=4", "calibration.n_samples=4", "calibration.seq_len=128", "seq_len=64"]
TABLE5 = [["experiment=table5", "compressor=none"]] + [
    ["experiment=table5", f"compressor={c}", f"align={a}"] for c in ("asvd", "llm_pruner") for a in ("unaligned", "gac")]
PAIRS = [["compressor=asvd", "allocation=default", "compressor.options.sensitivity_grid=[0.6,0.8]"],
         ["compressor=asvd", "allocation=proportional"],
         ["compressor=svd_llm", "allocation=default"],
         ["compressor=llm_pruner", "allocation=default"],
         ["compressor=palu", "allocation=default"],
         ["compressor=stable_rank_svd", "allocation=default"]]
POINTS = TABLE5 + [["ratio=0.2", "align=gac", *p] for p in PAIRS]

#: what a record says about the model (timings, memory, attempts, provenance and paths change with every run)
COMPARED = ("key", "job", "metrics", "aligned_fraction", "params", "budget", "plan", "compression")


def _untimed(x):
    """``x`` without the seconds anything took (keys ending in ``_s``)."""
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if not str(k).endswith("_s")}
    if isinstance(x, list):
        return [_untimed(v) for v in x]
    return x


def _view(rec: dict) -> dict:
    out = {k: rec.get(k) for k in COMPARED}
    if out["compression"] is not None:
        out["compression"] = {k: v for k, v in out["compression"].items() if k != "compression_wall_s"}
    out["record_keys"] = sorted(k for k in rec if not k.startswith("_") and k not in ("skipped", "skip_reason"))
    return json.loads(json.dumps(out))  # as JSON holds it: tuples are lists, floats their shortest repr


def compute(results_dir: Path) -> dict:
    """Every point run through the job into ``results_dir``: ``{point: its view}``."""
    from omegaconf import OmegaConf

    from gac.jobs.config.command_line import compose_config
    from gac.jobs.run.recipe import run_config

    out = {}
    for point in POINTS:
        over = [*SETTINGS, f"results_dir={results_dir}", *point]
        rec = run_config(OmegaConf.to_container(compose_config(over), resolve=True))
        out[" ".join(point)] = _view(rec)
    return out


@pytest.mark.slow
def test_table5_and_the_six_pairs_on_tiny_are_what_they_were(tmp_path):
    expected = json.loads(FIXTURE.read_text())
    got = compute(tmp_path / "results")
    assert sorted(got) == sorted(expected)
    for point, want in expected.items():
        for field, value in want.items():
            assert _untimed(got[point][field]) == _untimed(value), f"[{point}] {field} changed"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        FIXTURE.write_text(json.dumps(compute(Path(d) / "results"), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)
