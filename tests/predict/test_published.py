"""The published A100/H100 profiles: the shipped data against the values the authors state in text, provenance, the
extractor on a synthetic matplotlib PDF and (where a checkout of the authors' repository is present) on their PDFs."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from gac.profiling.published import PUBLISHED_GPUS, provenance, published_profile

#: report.md @f3f09de section 1.2 (A100, B=4 S=2048 H=32, fp16): head dim -> ms, stated to 0.001 ms
STATED_A100 = {64: 0.826, 96: 1.140, 104: 1.551, 107: 2.147, 112: 1.545, 120: 1.603, 128: 1.485}


@pytest.mark.parametrize("gpu", PUBLISHED_GPUS)
def test_the_shipped_profiles_load_with_their_provenance(gpu):
    p = published_profile(gpu)
    assert isinstance(p.meta.get("published"), dict) and p.meta["gpu"] == gpu
    src = provenance(p)
    assert src["repository"] == "https://github.com/JihaoXin/GAC" and len(src["commit"]) == 40
    assert any("driver" in u for u in src["unknown"]) and any("SXM" in u or "PCIe" in u for u in src["unknown"])
    sd = p.sweep("sdpa_head_dim")
    assert len(sd) == 145 and sd["dim"].min() == 64 and sd["dim"].max() == 256
    assert set(range(64, 161)) <= set(sd["dim"].astype(int))
    for axis in ("K", "N"):
        assert list(p.sweep(f"gemm_tput_{axis}")["dim"].astype(int)) == list(range(4000, 4101))
        assert list(p.sweep(f"gemv_{axis}")["dim"].astype(int)) == list(range(3800, 4301))
    assert p.meta["framework_reference"]["seq_len"] == 128  # the one end-to-end number a profile carries
    assert any("filtered" in s for s in p.sweeps())  # the median-filtered GEMM curves, marked as such


def test_a100_sdpa_matches_the_values_stated_in_text():
    sd = published_profile("a100").sweep("sdpa_head_dim")
    got = dict(zip(sd["dim"].astype(int), sd["latency_ms"]))
    for d, ms in STATED_A100.items():
        assert got[d] == pytest.approx(ms, abs=0.0006), d


def test_a100_forced_backends_from_the_report_say_auto_is_flash_at_107():
    t = published_profile("a100").table
    f = t[(t["sweep"] == "sdpa_head_dim") & (t["dim"] == 107)].set_index("backend")
    assert not bool(f.loc["efficient", "supported"])
    assert f.loc["flash", "latency_ms"] == pytest.approx(2.139)
    assert f.loc["math", "latency_ms"] > 10 * f.loc["flash", "latency_ms"]


def test_the_prefill_bars_match_table5():
    doc = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/data/paper_prefill.json").read_text())
    a = doc["prefill_ms"]["a100"]
    assert a["baseline"]["1024"] == pytest.approx(99.6, abs=0.05)
    assert a["unaligned"]["1024"] == pytest.approx(137.7, abs=0.05)
    assert a["gac"]["1024"] == pytest.approx(88.0, abs=0.05)


def test_profile_commands_work_on_the_published_profiles(tmp_path, capsys):
    from gac.cli import main
    from gac.profiling.published import published_dir

    assert main(["profile", "show", str(published_dir("h100"))]) == 0
    assert "median-filtered curve as drawn" in capsys.readouterr().out
    assert main(["profile", "cliffs", str(published_dir("a100"))]) == 0
    out = capsys.readouterr().out
    assert "gemm_tput_K" in out and "not analysed" in out
    assert main(["profile", "figures", str(published_dir("a100")), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "sdpa_latency.png").is_file()


# ---------------------------------------------------------------------------------------------- the extractor
pypdf = pytest.importorskip("pypdf", reason="the extractor needs pypdf (pip install 'gac[extract]')")


def _authors_style_pdf(path, dims, lat, line_x, line_y):
    """A figure drawn the way the authors' scripts draw: a scatter in two colours and a long red line."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.3, 1.85))
    ax, ax2 = fig.subplots(1, 2)
    dims, lat = np.asarray(dims), np.asarray(lat)
    m = dims % 8 == 0
    ax.scatter(dims[m], lat[m], color="#27AE60", s=12)
    ax.scatter(dims[~m], lat[~m], color="#E74C3C", s=3)
    ax.set_xticks([64, 96, 128, 160])
    ax2.plot(line_x, line_y, "-", color="#E07070")
    ax2.set_xticks([4000, 4050, 4100])
    fig.savefig(path)


def test_the_extractor_reads_back_a_matplotlib_pdf(tmp_path):
    from tools.extract_published import TC_RED, _line
    from tools.pdf_vectors import find_axes, read_page

    rng = np.random.default_rng(0)
    dims = list(range(64, 161))
    lat = 1 + 0.01 * np.arange(len(dims)) + 0.3 * (np.array(dims) % 8 != 0) + rng.uniform(0, 0.05, len(dims))
    lx = np.arange(4000, 4101)
    ly = 100 + 60 * (lx % 16 == 0) - 40 * (lx % 2) + rng.uniform(0, 1, len(lx))
    ly[50:60] = np.linspace(ly[50], ly[59], 10)  # collinear: matplotlib's simplification drops these vertices
    pdf = tmp_path / "fig.pdf"
    _authors_style_pdf(pdf, dims, lat, lx, ly)
    page = read_page(pdf)
    left = find_axes(page)
    left.sort(key=lambda a: a.rect[0])
    ax = left[0]
    pts = ax.data([(m.x, m.y) for m in page.markers if ax.contains(m.x, m.y)])
    got = dict(zip(np.round(pts[:, 0]).astype(int).tolist(), pts[:, 1].tolist()))
    assert np.allclose(pts[:, 0], np.round(pts[:, 0]), atol=0.01)  # x comes back as integers
    assert sorted(got) == dims
    assert np.allclose([got[d] for d in dims], lat, atol=1e-4)
    restored = {}
    line = _line(page, left[1], TC_RED, expect=range(4000, 4101), restored=restored)
    assert list(line) == list(range(4000, 4101))
    assert np.allclose([line[d] for d in lx], ly, atol=0.05)


def test_a_pdf_that_is_not_a_figure_is_one_clear_error(tmp_path):
    from gac.errors import GacError
    from tools.pdf_vectors import read_page

    bad = tmp_path / "x.pdf"
    bad.write_bytes(b"not a pdf at all")
    with pytest.raises(GacError, match="cannot parse"):
        read_page(bad)


def _authors_checkout():
    for c in (os.environ.get("GAC_AUTHORS_REPO"), "/tmp/GAC", "/tmp/predict22/GAC"):
        if c and (Path(c) / "Latex/figures/fig2_sdpa_latency.pdf").is_file():
            return Path(c)
    return None


@pytest.mark.skipif(_authors_checkout() is None,
                    reason="the authors' figure PDFs are absent (set GAC_AUTHORS_REPO to a checkout of "
                           "https://github.com/JihaoXin/GAC to run this)")
def test_the_extraction_script_regenerates_the_shipped_tables(tmp_path):
    from gac.profiling.profile import HardwareProfile
    from tools.extract_published import write_all

    res = write_all(_authors_checkout(), tmp_path / "out", tmp_path / "e2e.json", commit="0" * 40)
    for gpu in PUBLISHED_GPUS:
        new = HardwareProfile.load(tmp_path / "out" / gpu).table
        old = published_profile(gpu).table
        assert new.equals(old), gpu
        assert all(c.get("rel_error", 0) < 0.04 for c in res["profiles"][gpu]["checks"])


def test_the_report_numbers_are_checked_against_the_checkout(tmp_path):
    """The validation numbers typed from report.md (sections 5.2.2, 6.6, 6.7) must appear there as written."""
    from gac.errors import GacError
    from tools.published_report import (
        REPORT_BASELINE_67,
        REPORT_E2E_52,
        REPORT_SVDLLM_66,
        check_report,
    )

    s66 = " | ".join(f"{v:.2f}ms" for by in REPORT_SVDLLM_66.values() for v in by.values())
    s67 = " | ".join(f"{v:.2f}ms" for v in REPORT_BASELINE_67.values())
    s52 = " | ".join(str(v) for v in REPORT_E2E_52["tokens_per_s"].values())
    text = f"#### 5.2.2 x\n{s52}\n#### 5.2.3 y\n### 6.6 a\n{s66}\n### 6.7 b\n{s67}\n### 6.8 c\n"
    (tmp_path / "report.md").write_text(text)
    assert [c["all_found"] for c in check_report(tmp_path)] == [True, True, True]
    (tmp_path / "report.md").write_text(text.replace("24.29ms", "24.30ms"))
    with pytest.raises(GacError, match="6.7 baseline"):
        check_report(tmp_path)
    (tmp_path / "report.md").unlink()
    with pytest.raises(GacError, match="no report.md"):
        check_report(tmp_path)


def test_the_validation_sets_are_shipped_with_their_commit():
    doc = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/data/paper_prefill.json").read_text())
    for key in ("svd_llm", "e2e_b4", "report_baseline_67"):
        assert len(doc[key]["source"]["commit"]) == 40 and "report.md" in doc[key]["source"]["file"]
    assert doc["svd_llm"]["ranks"] == {"q_proj": 1433, "k_proj": 573, "v_proj": 573, "o_proj": 1433,
                                       "gate_proj": 2230, "up_proj": 2230, "down_proj": 2230}
