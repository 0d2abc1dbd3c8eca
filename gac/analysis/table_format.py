"""Tables as text: GitHub markdown or a booktabs LaTeX tabular, NaN as a blank cell."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import pandas as pd

from gac.errors import GacError


def format_table(
    df: pd.DataFrame,
    fmt: str = "markdown",
    formats: Mapping[str, str | Callable] | None = None,
    index: bool = True,
    caption: str | None = None,
) -> str:
    """Render a table as GitHub markdown (``"markdown"``/``"md"``) or a booktabs LaTeX tabular (``"latex"``/``"tex"``).

    ``formats`` maps a column to a ``str.format`` pattern (``"{:.2f}"``) or a callable; it defaults to
    ``df.attrs["formats"]`` and then ``"{:.4g}"`` for floats. NaN/None render as blank cells. A ``caption``
    (default: none) is a markdown line above the table, or ``\\caption`` in a LaTeX ``table`` environment. A
    MultiIndex (``proxy_quality``'s proxy and method) is one column per level, named by the level.
    """
    kind = {"markdown": "md", "md": "md", "latex": "tex", "tex": "tex"}.get(str(fmt).lower())
    if kind is None:
        raise GacError(f"unknown table format {fmt!r}; use 'markdown' (md) or 'latex' (tex)")
    fm = {**df.attrs.get("formats", {}), **(formats or {})}
    levels = df.index.nlevels if index else 0  # a MultiIndex (proxy, method) is one column per level
    numeric = [False] * levels + [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    cells = pd.DataFrame({i: [_cell(v, fm.get(c)) for v in df[c]] for i, c in enumerate(df.columns)})
    cells.columns = [str(c) for c in df.columns]
    for lvl in reversed(range(levels)):
        name = df.index.names[lvl] if levels > 1 else df.index.name
        cells.insert(0, str(name or ""), [_cell(v, None) for v in df.index.get_level_values(lvl)])
    if kind == "md":  # pandas -> tabulate's pipe format (GitHub markdown); cells are already formatted text
        cells = cells.map(lambda v: v.replace("|", "\\|"))
        cells.columns = [c.replace("|", "\\|") for c in cells.columns]
        text = cells.to_markdown(index=False, colalign=["right" if n else "left" for n in numeric],
                                 disable_numparse=True)
        return (f"**{caption}**\n\n" if caption else "") + text + "\n"
    styler = cells.style.format(escape="latex").format_index(escape="latex", axis=1).hide(axis="index")
    spec = "".join("r" if n else "l" for n in numeric)
    if caption:
        return styler.to_latex(hrules=True, column_format=spec, caption=_tex(caption), position="t",
                               position_float="centering")
    return styler.to_latex(hrules=True, column_format=spec)


def _cell(v, fmt) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return ""
    try:
        if pd.isna(v):
            return ""
    except (TypeError, ValueError):
        pass
    if callable(fmt):
        return str(fmt(v))
    if fmt:
        return fmt.format(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
        "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _tex(s: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in str(s))

