"""The notebooks in analysis/ execute on the fixture store (they call the same gac.analysis functions).

Every notebook run the module's selected tests ask for starts when the module does, two kernels at a time (each
its own process, environment and directories), so the runs overlap on two cores; each test judges its own run.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.analysis.conftest import PROFILE, STORE

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = sorted((Path(__file__).parents[2] / "analysis").glob("*.ipynb"))


def test_notebooks_exist():
    assert {p.name for p in NOTEBOOKS} >= {"table5.ipynb", "ratio_sweep.ipynb", "proxy_comparison.ipynb",
                                           "latency.ipynb", "plans.ipynb"}


def _execute(path: Path, tmp: Path, env: dict):
    """``path`` executed in a kernel with ``env`` (the store, profile and figure directories), cwd ``tmp``."""
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp)}}).execute(env=env)
    return nb


MAIN_STORE_NOTEBOOKS = ["ratio_sweep", "latency"]


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """``{(kind, name): Future of (notebook, tmp dir)}`` for the selected tests: ``"fixture"`` runs on the fixture
    store, ``"main"`` on the main job's store (:func:`_one_table5_store`)."""
    wanted = set()
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.module is request.module and "path" in params:
            wanted.add(("fixture", params["path"].stem))
        elif item.module is request.module and "name" in params:
            wanted.add(("main", params["name"]))
    base = {**os.environ, "MPLBACKEND": "Agg"}
    pool, futures = ThreadPoolExecutor(max_workers=2), {}
    for kind, name in sorted(wanted):
        tmp = tmp_path_factory.mktemp(f"nb_{kind}_{name}")
        env = {**base, "GAC_FIG_DIR": str(tmp / "figures")}
        if kind == "fixture":
            env.update(GAC_RESULTS_DIR=str(STORE), GAC_PROFILE_DIR=str(PROFILE))
        else:
            _one_table5_store(STORE, tmp / "store")
            env["GAC_RESULTS_DIR"] = str(tmp / "store")
            env.pop("GAC_PROFILE_DIR", None)
        path = Path(__file__).parents[2] / "analysis" / f"{name}.ipynb"
        futures[kind, name] = pool.submit(lambda p=path, t=tmp, e=env: (_execute(p, t, e), t))
    yield futures
    pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, runs):
    nb, tmp_path = runs["fixture", path.stem].result()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "records;" in text
    if path.stem == "table5":
        table = (tmp_path / "figures" / "report" / "fixture_table5_tiny_a100_r0.15.md").read_text()
        assert table in text  # shown as the report wrote it
        row = next(line for line in table.splitlines() if line.startswith("| ASVD (GAC) "))
        assert [c.strip() for c in row.strip("|").split("|")][:3] == ["ASVD (GAC)", "100%", "28.00"]
        assert "\\begin{tabular}" in text and "no side-by-side bench in the store" in text
    figs = sorted(p.name for p in (tmp_path / "figures" / "report").glob("*.png"))
    if path.stem == "latency":
        assert {"fixture_latency_seq_tiny_a100_r0.15.png", "staircase_profile_gemm.png",
                "staircase_profile_sdpa.png"} <= set(figs)
        assert "batch 4 left out of the figure" in text
    elif path.stem == "ratio_sweep":
        assert "fixture_ratio_sweep_tiny_a100.png" in figs
    elif path.stem == "proxy_comparison":
        assert "fixture_proxies_tiny_asvd_r0.2.png" in figs and "misaligned 8 (%)" in text
    elif path.stem == "plans":
        assert "fixture_plans_tiny_a100_r0.15_dstar.png" in figs and "aligned 16 (%)" in text


def _one_table5_store(src, dst):
    """The main job's store as a newcomer has it: Table 5 at one ratio, per-job smoke latencies, no bench."""
    import json
    import shutil

    shutil.copytree(src, dst)
    for f in (dst / "records").glob("*.json"):
        r = json.loads(f.read_text())
        if f.name.startswith(("a015", "p015", "b0")):
            r["job"]["experiment"] = "table5"
            f.write_text(json.dumps(r))
        else:
            f.unlink()


@pytest.mark.parametrize("name", MAIN_STORE_NOTEBOOKS)
def test_notebooks_on_the_main_jobs_store_say_what_is_missing_instead_of_drawing_it(name, runs):
    nb, tmp_path = runs["main", name].result()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    # no one-ratio "sweep" drawn from smoke latencies, no ValueError for one sequence length
    assert not list((tmp_path / "figures" / "report").glob(f"*{name.split('_')[0]}*.png"))
    assert "this store has nothing for" in text or "skipped:" in text
