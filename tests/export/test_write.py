"""What ``gac export`` does to the files beside its output, default tier: ONNX's exporter and onnxruntime are
stood in for (the graph and its side file written as plain bytes, the check a no-op), so only the export's own file
handling runs. The user's directory loses only earlier temp names of this output; an ONNX graph's ``<out>.data``
is refused without ``--force``, replaced with the graph, and removed when the new graph is inline."""

from __future__ import annotations

import os
import time

import pytest

from gac.cli import main

AGED = time.time() - 7 * 3600  # past GAC_TEMP_STALE_S (6 h): a temp name this old counts as a leftover


@pytest.fixture
def stand_in(monkeypatch):
    """The ONNX export with its engine stood in for; ``stand_in["side"] = True`` writes a side file too."""
    import gac.export.engines
    import gac.export.onnx

    opts = {"side": False}

    def export_onnx(model, path):
        path.write_bytes(b"graph")
        if opts["side"]:
            gac.export.onnx.data_file(path).write_bytes(b"weights")
        return path

    monkeypatch.setattr(gac.export.engines, "require", lambda *a, **k: None)
    monkeypatch.setattr(gac.export.onnx, "export_onnx", export_onnx)
    monkeypatch.setattr(gac.export.onnx, "verify_onnx", lambda path, model, threads=None: {"engine": "stand-in"})
    return opts


def _export(out, *extra) -> int:
    return main(["-q", "export", "tiny", "--format", "onnx", "-o", str(out), *extra])


def test_an_export_removes_only_its_own_leftover_temp_names(stand_in, tmp_path, capsys):
    d = tmp_path / "user"
    d.mkdir()
    other_tool_file = d / ".notes.txt.tmp12345"  # names gac <= 0.2 also used: another tool's here
    other_tool_dir = d / ".build.abcd1234.tmp"
    other_output = d / ".other.onnx.elsewhere.4242.0123abcd.tmp"  # gac's temp of another output
    mine = d / ".m.onnx.elsewhere.4242.0123abcd.tmp"  # an earlier export of m.onnx, killed
    mine_side = d / ".m.onnx.data.elsewhere.4242.89abcdef.tmp"  # its side file's temp
    other_tool_file.write_text("theirs")
    for p in (other_tool_dir, other_output, mine):
        p.mkdir()
        (p / "f").write_text("x")
    mine_side.write_bytes(b"w")
    for p in (other_tool_file, other_tool_dir, other_output, mine, mine_side):
        os.utime(p, (AGED, AGED))
    assert _export(d / "m.onnx") == 0, capsys.readouterr().err
    assert (d / "m.onnx").read_bytes() == b"graph"
    assert not mine.exists() and not mine_side.exists()
    assert other_tool_file.read_text() == "theirs"
    assert (other_tool_dir / "f").read_text() == "x" and (other_output / "f").read_text() == "x"
    assert sorted(p.name for p in d.iterdir()) == sorted(
        ["m.onnx", other_tool_file.name, other_tool_dir.name, other_output.name])


def test_an_existing_side_file_is_refused_without_force_before_any_work(stand_in, tmp_path, capsys, monkeypatch):
    import gac.models

    def boom(*a, **k):
        raise AssertionError("the checkpoint was read before the output was checked")

    monkeypatch.setattr(gac.models, "check_model_files", boom)
    out = tmp_path / "m.onnx"
    (tmp_path / "m.onnx.data").write_bytes(b"someone's weights")
    assert _export(out) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "m.onnx.data' already exists; refusing to overwrite it" in lines[0], lines
    assert "--force" in lines[0]
    assert not out.exists() and (tmp_path / "m.onnx.data").read_bytes() == b"someone's weights"


def test_force_replaces_the_side_file_and_removes_a_stale_one(stand_in, tmp_path, capsys):
    out, data = tmp_path / "m.onnx", tmp_path / "m.onnx.data"
    stand_in["side"] = True
    assert _export(out) == 0 and data.read_bytes() == b"weights"
    data.write_bytes(b"older")
    assert _export(out) == 2 and "m.onnx' already exists" in capsys.readouterr().err
    assert _export(out, "--force") == 0 and data.read_bytes() == b"weights"  # the new one, with its graph
    stand_in["side"] = False  # an inline graph now: the earlier export's weights file goes
    assert _export(out, "--force") == 0, capsys.readouterr().err
    assert out.read_bytes() == b"graph" and not data.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
