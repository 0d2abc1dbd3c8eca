"""Data points back from a matplotlib figure saved as a vector PDF: its paths, markers and tick labels.

A vector PDF keeps every plotted point as a coordinate of a path (a line's vertices, a bar's rectangle, a scatter
marker's placement), and its tick labels as text at known positions. :func:`read_page` interprets the page's
content stream (the graphics state: ``q``/``Q``/``cm``, colours, line width, clipping; paths ``m``/``l``/``c``/``re``
and how they are painted; text; marker XObjects drawn with ``Do``) into lists of :class:`PaintedPath`,
:class:`Marker` and :class:`Text` in page coordinates. :func:`find_axes` finds each axes' data rectangle (the clip
rectangle its data are drawn in) and its x/y tick marks with their labels, and fits the linear page-to-data map of
each axis from them (:class:`AxisMap`, with its residual, so a non-linear axis or a misread label is an error, not
a silent shift).

Only what matplotlib's PDF backend writes is supported (the figures of the GAC paper are matplotlib 3.10 output);
``pypdf`` parses the stream (``pip install 'gac[extract]'``), imported when a page is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gac.errors import GacError

Point = tuple[float, float]


@dataclass
class PaintedPath:
    """A path as painted: its subpaths (page coordinates), the paint operator and the graphics state at the time."""

    subpaths: list[list[Point]]
    op: str  # S (stroke), f/f* (fill), B/B* (fill + stroke), n (none: a clip)
    stroke: tuple[float, ...]
    fill: tuple[float, ...]
    width: float
    clip: tuple[float, float, float, float] | None  # x0, y0, x1, y1 of the clip rectangle in force
    block: int  # index of the top-level q...Q block it is drawn in (matplotlib: one artist or tick per block)
    closed: bool = False

    @property
    def points(self) -> list[Point]:
        return [p for sp in self.subpaths for p in sp]

    def bbox(self) -> tuple[float, float, float, float]:
        xs, ys = zip(*self.points)
        return min(xs), min(ys), max(xs), max(ys)


@dataclass
class Marker:
    """One placement of a marker XObject (a scatter point or a line marker)."""

    x: float
    y: float
    name: str
    fill: tuple[float, ...]
    stroke: tuple[float, ...]
    clip: tuple[float, float, float, float] | None
    block: int


@dataclass
class Text:
    x: float  # origin of the first glyph, page coordinates
    y: float
    text: str
    size: float
    block: int


@dataclass
class Page:
    width: float
    height: float
    paths: list[PaintedPath] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    texts: list[Text] = field(default_factory=list)


def _mul(a, b):
    """3x3 affine product of PDF matrices [a b c d e f] (row vectors: p' = p @ a then @ b)."""
    a0, a1, a2, a3, a4, a5 = a
    b0, b1, b2, b3, b4, b5 = b
    return (a0 * b0 + a1 * b2, a0 * b1 + a1 * b3, a2 * b0 + a3 * b2, a2 * b1 + a3 * b3,
            a4 * b0 + a5 * b2 + b4, a4 * b1 + a5 * b3 + b5)


def _apply(m, x, y) -> Point:
    return (m[0] * x + m[2] * y + m[4], m[1] * x + m[3] * y + m[5])


_IDENTITY = (1.0, 0.0, 0.0, 1.0, 0.0, 0.0)


def _text_of(operand) -> str:
    if isinstance(operand, list):
        return "".join(_text_of(o) for o in operand if not isinstance(o, (int, float)))
    if isinstance(operand, bytes):
        return operand.decode("latin-1")
    return str(operand)


def read_page(pdf: str | Path, page: int = 0) -> Page:
    """Interpret one page of ``pdf`` (see the module docstring)."""
    try:
        import pypdf
        from pypdf.generic import ContentStream
    except ImportError:  # pragma: no cover - depends on the environment
        raise GacError("reading figure PDFs needs pypdf: pip install 'gac[extract]' (or pip install pypdf)") from None
    path = Path(pdf)
    if not path.is_file():
        raise GacError(f"figure PDF {str(pdf)!r} does not exist")
    try:
        reader = pypdf.PdfReader(str(path))
        pg = reader.pages[page]
        ops = ContentStream(pg.get_contents(), reader).operations
    except Exception as e:  # pypdf raises many kinds for a damaged file
        raise GacError(f"cannot parse {str(pdf)!r} as a PDF ({type(e).__name__}: {e})") from None
    box = pg.mediabox
    out = Page(float(box.width), float(box.height))
    xobjects = pg.get("/Resources", {}).get("/XObject", {})
    state = {"ctm": _IDENTITY, "stroke": (0.0,), "fill": (0.0,), "width": 1.0, "clip": None}
    stack: list[dict] = []
    sub: list[list[Point]] = []
    closed = False
    pending_clip = False
    depth = 0
    block = -1
    text_m = _IDENTITY
    line_m = _IDENTITY
    font_size = 0.0
    for operands, op in ops:
        o = op.decode("latin-1") if isinstance(op, bytes) else str(op)
        if o == "q":
            stack.append(dict(state))
            if depth == 0:
                block += 1
            depth += 1
        elif o == "Q":
            if stack:
                state = stack.pop()
            depth = max(0, depth - 1)
        elif o == "cm":
            state["ctm"] = _mul(tuple(float(v) for v in operands), state["ctm"])
        elif o in ("RG", "G", "K"):
            state["stroke"] = tuple(float(v) for v in operands)
        elif o in ("rg", "g", "k"):
            state["fill"] = tuple(float(v) for v in operands)
        elif o == "w":
            state["width"] = float(operands[0])
        elif o == "m":
            sub.append([_apply(state["ctm"], float(operands[0]), float(operands[1]))])
        elif o == "l":
            if not sub:
                sub.append([])
            sub[-1].append(_apply(state["ctm"], float(operands[0]), float(operands[1])))
        elif o == "c":
            if not sub:
                sub.append([])
            sub[-1].append(_apply(state["ctm"], float(operands[4]), float(operands[5])))
        elif o in ("v", "y"):
            if not sub:
                sub.append([])
            sub[-1].append(_apply(state["ctm"], float(operands[2]), float(operands[3])))
        elif o == "re":
            x, y, w, h = (float(v) for v in operands)
            sub.append([_apply(state["ctm"], x, y), _apply(state["ctm"], x + w, y),
                        _apply(state["ctm"], x + w, y + h), _apply(state["ctm"], x, y + h)])
            closed = True
        elif o == "h":
            closed = True
        elif o in ("W", "W*"):
            pending_clip = True
        elif o in ("S", "s", "f", "F", "f*", "B", "B*", "b", "b*", "n"):
            pts = [p for sp in sub for p in sp]
            if pending_clip and pts:
                xs, ys = zip(*pts)
                state["clip"] = (min(xs), min(ys), max(xs), max(ys))
            if o != "n" and pts:
                out.paths.append(PaintedPath([list(sp) for sp in sub if sp], o, state["stroke"], state["fill"],
                                             state["width"], state["clip"], block, closed or o in ("s", "b", "b*")))
            sub, closed, pending_clip = [], False, False
        elif o == "Do":
            name = str(operands[0])
            xo = xobjects.get(name)
            if xo is not None and xo.get_object().get("/Subtype") == "/Form":
                x, y = _apply(state["ctm"], 0.0, 0.0)
                out.markers.append(Marker(x, y, name, state["fill"], state["stroke"], state["clip"], block))
        elif o == "BT":
            text_m = line_m = _IDENTITY
        elif o == "Tf":
            font_size = float(operands[1])
        elif o == "Td":
            line_m = _mul((1, 0, 0, 1, float(operands[0]), float(operands[1])), line_m)
            text_m = line_m
        elif o == "Tm":
            line_m = text_m = tuple(float(v) for v in operands)
        elif o in ("Tj", "TJ", "'", '"'):
            s = _text_of(operands[-1])
            x, y = _apply(_mul(text_m, state["ctm"]), 0.0, 0.0)
            out.texts.append(Text(x, y, s, font_size, block))
    return out


# ---------------------------------------------------------------------------------------------- axes
_NUM = re.compile(r"^[\u2212\-+]?\d+(\.\d*)?$")


def parse_number(text: str) -> float | None:
    """A tick label's value (``"1.5"``, ``"4096"``, ``"−0.5"`` with a Unicode minus); None if it is not a number."""
    t = text.strip().replace("\u2212", "-").replace("\x96", "-").replace("$", "")
    return float(t) if _NUM.match(t) else None


@dataclass
class AxisMap:
    """``value = slope * page + offset`` for one axis, fitted to its labelled ticks."""

    slope: float
    offset: float
    ticks: list[tuple[float, float]]  # (page coordinate, label value)
    residual: float  # max |fitted - label| over the ticks, in data units

    def __call__(self, page_coord):
        return self.slope * np.asarray(page_coord, dtype=float) + self.offset

    def inverse(self, value):
        return (np.asarray(value, dtype=float) - self.offset) / self.slope


@dataclass
class Axes:
    """One axes: its data rectangle (page coordinates), the maps of its two axes (``x`` is None when its ticks carry
    no numeric labels: a shared x axis labelled on another axes, or categories) and the x tick positions."""

    rect: tuple[float, float, float, float]
    x: AxisMap | None
    y: AxisMap
    x_ticks: list[tuple[float, str]] = field(default_factory=list)  # (page x, label text or "") of every x tick

    def contains(self, x: float, y: float, pad: float = 0.5) -> bool:
        x0, y0, x1, y1 = self.rect
        return x0 - pad <= x <= x1 + pad and y0 - pad <= y <= y1 + pad

    def data(self, points) -> np.ndarray:
        if self.x is None:
            raise GacError(f"the axes at {self.rect} has no numeric x labels; map its x axis from another axes")
        pts = np.asarray(points, dtype=float).reshape(-1, 2)
        return np.column_stack([self.x(pts[:, 0]), self.y(pts[:, 1])])


def _fit(ticks: list[tuple[float, float]], what: str) -> AxisMap:
    if len(ticks) < 2:
        raise GacError(f"{what}: fewer than two labelled ticks; cannot map it to data")
    pos = np.array([t[0] for t in ticks])
    val = np.array([t[1] for t in ticks])
    slope, offset = np.polyfit(pos, val, 1)
    resid = float(np.max(np.abs(slope * pos + offset - val)))
    span = float(val.max() - val.min()) or 1.0
    if resid > 1e-3 * span:
        raise GacError(f"{what}: tick labels are not linear in position (residual {resid:.3g}); a log axis or a misread "
                       f"label")
    return AxisMap(float(slope), float(offset), sorted(ticks), resid)


def _spine_rects(page: Page) -> set[tuple[float, float, float, float]]:
    """Rectangles drawn as four unclipped strokes (an axes' spines)."""
    v, h = [], []
    for p in page.paths:
        if p.clip is not None or p.op != "S" or len(p.points) != 2:
            continue
        (x0, y0), (x1, y1) = p.points
        if abs(x0 - x1) < 1e-3 and abs(y0 - y1) > 10:
            v.append((x0, min(y0, y1), max(y0, y1)))
        elif abs(y0 - y1) < 1e-3 and abs(x0 - x1) > 10:
            h.append((y0, min(x0, x1), max(x0, x1)))
    out = set()
    for xa, ya0, ya1 in v:
        for xb, yb0, yb1 in v:
            if xb <= xa + 10 or abs(ya0 - yb0) > 0.1 or abs(ya1 - yb1) > 0.1:
                continue
            if any(abs(y - ya0) < 0.1 and abs(a - xa) < 0.1 and abs(b - xb) < 0.1 for y, a, b in h):
                out.add((xa, ya0, xb, ya1))
    return out


def _label_near(texts: list[Text], x: float, y: float, axis: str, limit: float = 12.0) -> Text | None:
    """The numeric text nearest a tick's outer end: below an x tick (its centre), left of a y tick (its middle)."""
    best, dist = None, limit
    for t in texts:
        if parse_number(t.text) is None:
            continue
        w = 0.55 * t.size * len(t.text)
        cx, cy = t.x + w / 2, t.y + 0.35 * t.size
        if axis == "x" and t.y < y:
            d = abs(cx - x) + 0.25 * abs(cy - y)
        elif axis == "y" and t.x < x:
            d = abs(cy - y) + 0.25 * abs(t.x + w - x)
        else:
            continue
        if d < dist:
            best, dist = t, d
    return best


def find_axes(page: Page, tick_len: tuple[float, float] = (1.5, 6.0)) -> list[Axes]:
    """Every axes of ``page``: a data rectangle (a clip rectangle data are drawn in, or four spines) with at least two
    numerically labelled y ticks, sorted top to bottom, then left to right. A tick is a short stroke perpendicular to
    a side of the rectangle, outside it; its label is the numeric text in the same top-level block (how the GAC
    figures are written) or else the nearest one beyond the tick's end."""
    rects = sorted({p.clip for p in page.paths if p.clip is not None} |
                   {m.clip for m in page.markers if m.clip is not None})
    for r in sorted(_spine_rects(page)):
        if not any(all(abs(a - b) < 0.6 for a, b in zip(r, q)) for q in rects):
            rects.append(r)
    # a clip rectangle that only a full-page background uses is not an axes
    rects = [r for r in rects if (r[2] - r[0]) < page.width - 1 or (r[3] - r[1]) < page.height - 1]
    texts_by_block: dict[int, list[Text]] = {}
    for t in page.texts:
        texts_by_block.setdefault(t.block, []).append(t)
    found = []
    for rect in rects:
        x0, y0, x1, y1 = rect
        xt, yt, xmarks = [], [], []
        for p in page.paths:
            if p.clip is not None or p.op not in ("S", "B", "B*") or len(p.points) != 2:
                continue
            (ax_, ay_), (bx_, by_) = p.points
            block = [t for t in texts_by_block.get(p.block, []) if parse_number(t.text) is not None]
            is_x = abs(ax_ - bx_) < 1e-3 and tick_len[0] <= abs(ay_ - by_) <= tick_len[1] and \
                x0 - 0.5 <= ax_ <= x1 + 0.5 and abs(max(ay_, by_) - y0) < 0.6
            is_y = abs(ay_ - by_) < 1e-3 and tick_len[0] <= abs(ax_ - bx_) <= tick_len[1] and \
                y0 - 0.5 <= ay_ <= y1 + 0.5 and abs(max(ax_, bx_) - x0) < 0.6
            if not (is_x or is_y):
                continue
            if len(block) == 1:
                label = block[0]
            elif is_x:
                label = _label_near(page.texts, ax_, min(ay_, by_), "x")
            else:
                label = _label_near(page.texts, min(ax_, bx_), ay_, "y")
            if is_x:
                xmarks.append((ax_, label.text if label is not None else ""))
                if label is not None:
                    xt.append((ax_, parse_number(label.text)))
            elif label is not None:
                yt.append((ay_, parse_number(label.text)))
        if len({v for _, v in yt}) < 2:
            continue
        xmap = None
        if len({v for _, v in xt}) >= 2:
            try:
                xmap = _fit(xt, f"x axis of the axes at {rect}")
            except GacError:
                xmap = None  # categorical labels (bar groups): the caller maps them
        found.append(Axes(rect, xmap, _fit(yt, f"y axis of the axes at {rect}"), sorted(xmarks)))
    found.sort(key=lambda a: (-round(a.rect[3]), a.rect[0]))
    return found


def color_close(c: tuple[float, ...], hex_color: str, tol: float = 0.02) -> bool:
    """Is the PDF colour ``c`` (RGB or gray) the ``#rrggbb`` colour ``hex_color``?"""
    want = tuple(int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    rgb = c * 3 if len(c) == 1 else c
    return len(rgb) == 3 and all(abs(a - b) <= tol for a, b in zip(rgb, want))
