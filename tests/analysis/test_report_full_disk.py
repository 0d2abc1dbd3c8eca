"""A report whose disk fills half-way (a full tmpfs) leaves no partial report behind as if complete: the files it
had written are removed, the directory too when the report made it, and the error is one line saying so."""

from __future__ import annotations

import errno

import pytest

from gac.errors import GacError
from tests.analysis.test_latency_pareto import _frame


@pytest.mark.parametrize("made", [True, False])
def test_a_report_that_runs_out_of_space_leaves_nothing_half_written(tmp_path, monkeypatch, made):
    import gac.analysis.report_dir as R

    out = tmp_path / "out"
    if not made:  # an existing empty directory: kept, emptied of what the report wrote
        out.mkdir()
    real, calls = R.write_text_atomic, []

    def filling(path, text, overwrite=False, **kw):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, text, overwrite=overwrite, **kw)

    monkeypatch.setattr(R, "write_text_atomic", filling)
    with pytest.raises(GacError, match=r"could not be written \(No space left on device\); the files it had written "
                                       r"were removed"):
        R.write_report(_frame(), out, figure_formats=["png"])
    assert len(calls) == 3
    assert out.exists() is (not made)
    if not made:
        assert list(out.iterdir()) == []
