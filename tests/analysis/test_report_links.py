"""``gac report --force`` into a directory where someone planted links: every link with a name the report writes is
replaced by the report's own file, and the file it pointed at (outside the output directory) is left as it was."""

import os
from pathlib import Path

import pytest

from gac.cli import main
from gac.errors import GacError
from gac.io import replace_file, write_text_atomic
from tests.analysis.conftest import STORE


def test_report_force_replaces_planted_links_and_never_writes_through_them(tmp_path, capsys):
    out, outside = tmp_path / "report", tmp_path / "outside"
    outside.mkdir()
    victims = {}
    out.mkdir()
    for name in ("index.md", "fixture_table5_tiny_a100_r0.15.md", "fixture_ratio_sweep_tiny_a100.png"):
        victims[name] = outside / f"{name}.victim"
        victims[name].write_text("a colleague's file\n")
        (out / name).symlink_to(victims[name])
    (out / "dangling.md").symlink_to(outside / "nothing-here")
    assert main(["report", str(STORE), "-o", str(out), "--force", "--format", "md", "--figures", "png"]) == 0
    capsys.readouterr()
    for name, victim in victims.items():
        assert victim.read_text() == "a colleague's file\n", name  # never written through
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0, name  # the report's own file
    assert (out / "index.md").read_text().startswith("# gac report")
    assert (out / "dangling.md").is_symlink()  # not a name the report writes: left alone
    assert sorted(outside.iterdir()) == sorted(victims.values())  # nothing created out there either
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_write_text_atomic_and_replace_file_replace_a_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    link = tmp_path / "d" / "out.txt"
    link.parent.mkdir()
    link.symlink_to(victim)
    with pytest.raises(GacError, match="already exists; refusing to overwrite it"):
        write_text_atomic(link, "new")
    write_text_atomic(link, "new", overwrite=True)
    assert victim.read_text() == "keep" and not link.is_symlink() and link.read_text() == "new"

    fig = tmp_path / "d" / "fig.png"
    fig.symlink_to(victim)
    replace_file(fig, lambda tmp: Path(tmp).write_text("png bytes"))
    assert victim.read_text() == "keep" and not fig.is_symlink() and fig.read_text() == "png bytes"

    def fails(tmp):
        Path(tmp).write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(GacError, match="cannot write .*the disk is full"):
        replace_file(fig, fails)
    assert fig.read_text() == "png bytes" and sorted(os.listdir(fig.parent)) == ["fig.png", "out.txt"]
