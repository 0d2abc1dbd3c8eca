"""Output error of PaLU's two decompositions, ``svd`` and ``whiten`` (the default), on tiny's K/V projections.

    python benchmarks/palu_error.py                     # ranks 96 64 48 32, calibration 32 x 256 (tiny train)

For every k_proj and v_proj of tiny (one head group: tiny has 2 KV heads), the relative output error
``||(W - A_r B_r) X^T||_F / ||W X^T||_F`` of gac's factors at rank r, with X the projection's inputs on the
calibration tokens (what whitening fits) and on held-out tokens (the first windows of tiny's test text).
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", nargs="+", type=int, default=[96, 64, 48, 32])
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--calib-seq-len", type=int, default=256)
    ap.add_argument("--heldout-windows", type=int, default=8, help="1024-token windows of tiny's test text")
    args = ap.parse_args(argv)

    import torch

    from gac.compression.compress import Calibration
    from gac.compression.compressors.lowrank_math import svd_factors, whitened_factors, whitening
    from gac.compression.discovery import discover
    from gac.compression.importance import collect_activation_stats
    from gac.models import load_model
    from gac.text import load_text, tokenize_text

    model, tok = load_model("tiny", dtype=torch.float32)
    model.eval()
    layout = discover(model)
    names = layout.linear_names(("k_proj", "v_proj"))
    calib = Calibration("tiny", args.calib_samples, args.calib_seq_len, seed=0).token_ids(tok)
    ids = torch.as_tensor(tokenize_text(tok, load_text("tiny", "test"))).reshape(-1)
    held = ids[: args.heldout_windows * 1024].reshape(args.heldout_windows, 1024)
    cal = collect_activation_stats(model, layout, calib, names, xtx=True)
    hel = collect_activation_stats(model, layout, held, names, xtx=True)

    def rel_err(W, A, B, xtx):  # ||(W - AB) X^T||_F / ||W X^T||_F from X^T X
        D = (W.double() - A.double() @ B.double())
        return float(torch.sqrt(torch.trace(D @ xtx @ D.T) / torch.trace(W.double() @ xtx @ W.double().T)))

    rows = {}
    for n in names:
        W = model.get_submodule(n).weight.detach()
        L, how = whitening(cal[n].xtx, name=n)
        f = {"svd": svd_factors(W, name=n), "whiten": whitened_factors(W, L, name=n)}
        for kind, (A, B) in f.items():
            for r in args.ranks:
                rows[(n, kind, r)] = (rel_err(W, A[:, :r], B[:r], cal[n].xtx), rel_err(W, A[:, :r], B[:r], hel[n].xtx))
    print(f"tiny K/V projections {tuple(model.get_submodule(names[0]).weight.shape)}; calibration {tuple(calib.shape)}, "
          f"held-out {tuple(held.shape)}; load average {os.getloadavg()[0]:.2f}")
    print("| projection | decomposition | " + " | ".join(f"r={r} calib / held-out" for r in args.ranks) + " |")
    print("|:---|:---|" + "---:|" * len(args.ranks))
    groups = [(n, [n]) for n in names] + [(f"mean of {p}", [n for n in names if n.endswith(p)]) for p in ("k_proj", "v_proj")]
    for label, ns in groups:
        for kind in ("svd", "whiten"):
            cells = []
            for r in args.ranks:
                c = sum(rows[(n, kind, r)][0] for n in ns) / len(ns)
                h = sum(rows[(n, kind, r)][1] for n in ns) / len(ns)
                cells.append(f"{c:.4f} / {h:.4f}")
            print(f"| {label.replace('model.layers.', 'L').replace('.self_attn', '')} | {kind} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
