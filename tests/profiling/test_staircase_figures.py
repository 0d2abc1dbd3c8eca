"""The staircase figure drawn from the published A100 profile: a forced backend far above the staircase (Math at
~27 ms against 1-5 ms) is named in a note instead of being drawn, so the staircase keeps its scale."""

import matplotlib

matplotlib.use("Agg")

from gac.profiling.figures import OFF_SCALE, staircase_figures  # noqa: E402
from gac.profiling.published import published_profile  # noqa: E402


def test_off_scale_forced_backend_is_a_note_not_a_line():
    prof = published_profile("a100")
    fig = staircase_figures(prof.table, device=prof.device_name, dtype=prof.dtype)["sdpa"]
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert "math (forced)" not in labels                    # drawn, it would flatten the staircase
    assert "flash (forced)" in labels                        # on scale: drawn
    notes = [t.get_text() for t in ax.texts if "off scale" in t.get_text()]
    assert len(notes) == 1 and notes[0].startswith("math (forced)")
    lo, hi = ax.get_ylim()
    assert hi < 10                                            # the auto staircase's own scale (max ~4.7 ms)
    assert OFF_SCALE * hi < 27                                # and Math is indeed far above it
