"""The notebooks in analysis/ execute on the fixture store (they call the same gac.analysis functions)."""

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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("GAC_RESULTS_DIR", str(STORE))
    monkeypatch.setenv("GAC_PROFILE_DIR", str(PROFILE))
    monkeypatch.setenv("GAC_FIG_DIR", str(tmp_path / "figures"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "records;" in text
    if path.stem == "table5":
        row = next(line for line in text.splitlines() if line.startswith("| ASVD (GAC) "))
        assert [c.strip() for c in row.strip("|").split("|")][:3] == ["ASVD (GAC)", "100%", "28.00"]
        assert "\\begin{tabular}" in text and "no side-by-side bench in this store" in text
    figs = sorted(p.name for p in (tmp_path / "figures").glob("*.png")) if path.stem != "table5" else []
    if path.stem == "latency":
        assert figs == ["latency_seq.png", "staircase_gemm.png", "staircase_sdpa.png"]
    elif path.stem in ("ratio_sweep", "proxy_comparison"):
        assert len(figs) == 1
    elif path.stem == "plans":
        assert figs == ["dstar.png", "residues.png"] and "aligned 16 (%)" in text
