"""The quality cost of one shared expert width against per-expert widths, at the same parameter budget.

    python benchmarks/moe_quality.py --out docs/results-moe.md        # about 1.5 CPU minutes
    python benchmarks/moe_quality.py --quick --out /tmp/moe.md        # a smoke run (tests/test_benchmarks.py)

gac has no trained mixture-of-experts model (none can be downloaded here), and a random-weight one has no quality to
lose. So the MoE here is **tiny (the trained 4-layer Llama shipped in gac/data/tiny) made into a Mixtral**: each
layer's MLP (width 688) split into ``--experts`` experts of 688 / E channels each, every expert routed for every
token (top-k = E, a zero router: weights 1/E, the down projections scaled by E), so the Mixtral computes tiny's
logits (checked) and its experts are the channel groups of a trained MLP. Two splits:

* ``contiguous``: expert e holds channels [e I/E, (e+1) I/E): experts alike, as a trained MoE's experts are in size;
* ``sorted``: channels sorted by their weight norms (``|gate row| |up row| |down col|``), the strongest quarter in
  expert 0 and so on: experts as unequal in importance as a split can make them (the case where one width for all
  experts should cost most).

LLM-Pruner (its own layers and Taylor importance, calibration on tiny's training text) prunes the experts with
``expert_width=shared`` (one width per layer, fused) and ``per_expert`` (ExpertMLPs) at each ``--ratios`` and with
its default ``uniform`` allocation and the score-driven ``proportional`` one, every plan aligned by gac's knapsack
at the same budget. Reported per plan: perplexity on tiny's held-out text (``test.txt``), and the relative
reconstruction error of the pruned MoE layers: ``||y' - y|| / ||y||`` of each pruned layer's output y' against the
dense layer's y, both fed the dense model's input to that layer on calibration text, averaged over the pruned
layers. ``--out FILE`` writes the table between this script's markers in FILE, the rest of FILE as it is.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

MARKER = "moe_quality"  # its table sits between <!-- moe_quality: begin --> and <!-- moe_quality: end --> in --out
TINY = Path(__file__).resolve().parents[1] / "gac" / "data" / "tiny"


def moe_from_dense(dense, experts: int, split: str):
    """A Mixtral computing ``dense``'s (a Llama's) function: its MLPs split into ``experts`` channel groups (module
    docstring)."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    c = dense.config
    inter = c.intermediate_size
    if inter % experts:
        raise SystemExit(f"--experts {experts} does not divide the MLP width {inter}")
    w = inter // experts
    cfg = MixtralConfig(hidden_size=c.hidden_size, intermediate_size=w, num_hidden_layers=c.num_hidden_layers,
                        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                        head_dim=c.head_dim, num_local_experts=experts, num_experts_per_tok=experts,
                        vocab_size=c.vocab_size, max_position_embeddings=c.max_position_embeddings,
                        rms_norm_eps=c.rms_norm_eps, rope_parameters=dict(c.rope_parameters), sliding_window=None,
                        tie_word_embeddings=c.tie_word_embeddings, hidden_act=c.hidden_act,
                        bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id)
    moe = MixtralForCausalLM(cfg).eval()
    sd = dense.state_dict()
    own = moe.state_dict()
    with torch.no_grad():
        for k, v in sd.items():
            if ".mlp." not in k and k in own:
                own[k].copy_(v)
        for i, layer in enumerate(dense.model.layers):
            g, u, d = layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight, layer.mlp.down_proj.weight
            if split == "sorted":
                strength = g.norm(dim=1) * u.norm(dim=1) * d.norm(dim=0)
                order = torch.argsort(strength, descending=True, stable=True)
            else:
                order = torch.arange(inter)
            ex = moe.model.layers[i].mlp
            ex.gate.weight.zero_()  # every expert weighted 1/E
            for e in range(experts):
                ch = order[e * w:(e + 1) * w]
                ex.experts.gate_up_proj[e].copy_(torch.cat([g[ch], u[ch]]))
                ex.experts.down_proj[e].copy_(d[:, ch] * experts)
    moe.tie_weights()
    return moe


def _layer_io(model, ids, layers):
    """Each pruned layer's MLP input and output on ``ids`` (forward hooks on the model's own modules)."""
    import torch

    got, hooks = {}, []
    for i in layers:
        def hook(mod, args, out, i=i):
            got[i] = (args[0].detach(), out.detach())
        hooks.append(model.model.layers[i].mlp.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for h in hooks:
            h.remove()
    return got


def _recon_error(pruned, io) -> float:
    import torch

    errs = []
    with torch.no_grad():
        for i, (x, y) in io.items():
            errs.append(float((pruned.model.layers[i].mlp(x) - y).norm() / y.norm()))
    return sum(errs) / len(errs)


def _measure(a, tok, dense, calib, probe) -> list[tuple]:
    """One row per plan (and per split's dense model): split, allocation, expert width, ratio, params / budget,
    perplexity, layer error, widths."""
    import torch

    from gac.compression.compressors import get_compressor
    from gac.compression.preparation import prepare
    from gac.evaluation.perplexity import perplexity

    windows = a.ppl_windows or None
    rows = []
    for split in a.splits:
        moe = moe_from_dense(dense, a.experts, split)
        with torch.no_grad():
            want, got = dense(probe).logits, moe(probe).logits
        err = float((got - want).norm() / want.norm())
        if err > 1e-4:
            raise SystemExit(f"the {split} MoE does not compute tiny's logits (relative error {err:.2e})")
        base_ppl = perplexity(moe, tok, "tiny", seq_len=a.ppl_seq_len, max_windows=windows)["ppl"]
        layers = get_compressor("llm_pruner").layer_indices(moe.config.num_hidden_layers)
        io = _layer_io(moe, probe, layers)
        rows.append((split, "dense", "", "", "", base_ppl, 0.0, f"{moe.config.intermediate_size} (every expert)"))
        for alloc in a.allocations:
            for mode in ("shared", "per_expert"):
                prep = prepare(copy.deepcopy(moe), tok, "llm_pruner", calib_ids=calib, allocation=alloc,
                               compressor_options={"expert_width": mode})
                for ratio in a.ratios:
                    cm, plan, _ = prep.compress(ratio, "gac", unit=8)
                    ppl = perplexity(cm, tok, "tiny", seq_len=a.ppl_seq_len, max_windows=windows)["ppl"]
                    ws = sorted(plan.dims.values())
                    widths = f"{ws[0]}-{ws[-1]}" if ws[0] != ws[-1] else f"{ws[0]}"
                    rows.append((split, alloc, mode, ratio, f"{plan.params:,} / {plan.budget:,}", ppl,
                                 _recon_error(cm, io), widths))
                    print(f"{split} {alloc} {mode} ratio {ratio}: ppl {ppl:.3f}, layer error {rows[-1][6]:.4f}, "
                          f"widths {widths}", file=sys.stderr)
                    del cm
                del prep
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--ratios", type=float, nargs="+", default=[0.2, 0.4])
    ap.add_argument("--splits", nargs="+", default=["contiguous", "sorted"])
    ap.add_argument("--allocations", nargs="+", default=["uniform", "proportional"])
    ap.add_argument("--calib", default="16x256", help="calibration samples x tokens of tiny's training text")
    ap.add_argument("--ppl-seq-len", type=int, default=256)
    ap.add_argument("--ppl-windows", type=int, default=64, help="windows of tiny's test text scored (0: all)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (more measured slower on a shared machine)")
    ap.add_argument("--quick", action="store_true", help="one split, one ratio, few tokens: checks the script runs")
    ap.add_argument("--out", required=True, help="the markdown file the table goes into")
    a = ap.parse_args(argv)
    if a.quick:
        a.ratios, a.splits, a.allocations, a.calib, a.ppl_seq_len, a.ppl_windows = [0.3], ["sorted"], ["uniform"], "2x32", 32, 1
    command = "python benchmarks/moe_quality.py " + " ".join(argv if argv is not None else sys.argv[1:])
    t_start = time.perf_counter()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gac.compression.calibration import Calibration
    from gac.io import write_marked_block

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(TINY))
    dense = AutoModelForCausalLM.from_pretrained(str(TINY), dtype=torch.float32).eval()
    n, t = (int(x) for x in a.calib.split("x"))
    calib = Calibration("tiny", n, t).token_ids(tok)
    probe = calib[: min(4, n)]
    threads = torch.get_num_threads()
    torch.set_num_threads(a.threads)
    try:
        rows = _measure(a, tok, dense, calib, probe)
    finally:
        torch.set_num_threads(threads)
    lines = [
        f"`{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {time.perf_counter() - t_start:.0f} s, "
        f"load average {os.getloadavg()[0]:.2f} at the end; quality numbers, not timings). "
        f"{a.threads} thread(s). The MoE is tiny made into a Mixtral of {a.experts} experts per layer, every expert active (see the script's "
        f"docstring): its perplexity is tiny's. Calibration {n} x {t} tokens of tiny's training text; perplexity on "
        f"tiny's test text ({a.ppl_windows or 'all'} windows of {a.ppl_seq_len} tokens); layer error: mean over the pruned layers of "
        f"||y' - y|| / ||y|| with the dense layer inputs ({probe.shape[0]} calibration samples).",
        "",
        "| split | allocation | expert width | ratio | expert params / budget | widths | perplexity | layer error |",
        "|---|---|---|---:|---|---|---:|---:|",
    ]
    for split, alloc, mode, ratio, params, ppl, err, widths in rows:
        lines.append(f"| {split} | {alloc} | {mode} | {ratio} | {params} | {widths} | {ppl:.3f} | {err:.4f} |")
    write_marked_block(Path(a.out), MARKER, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
