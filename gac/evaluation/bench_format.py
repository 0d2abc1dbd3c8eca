"""A bench document as text: the terminal table of what was measured, and a prediction of another GPU beside it."""

from __future__ import annotations

from gac.evaluation.bench_device import CPU_NOTE

TIMER_WORDS = {"cuda_events": "CUDA events", "perf_counter": "wall clock (perf_counter)",
               "thread_time": "the thread's CPU time (wall clock recorded beside it)"}


def _pct(r) -> str:
    return "" if r is None else f"{100 * (r - 1):+.1f}%"


def _ci(ci) -> str:
    return "" if not ci else f"[{100 * (ci[0] - 1):+.1f}, {100 * (ci[1] - 1):+.1f}]"


def format_bench(doc: dict) -> str:
    """The terminal table of a bench document."""
    dev = doc["device"]
    prot = doc["protocol"]
    lines = []
    where = f"{dev['name']} ({dev['type']}"
    where += f", {dev.get('threads')} thread{'s' if dev.get('threads') != 1 else ''})" if dev["type"] == "cpu" else ")"
    lines.append(f"Side-by-side latency on {where}, {doc['dtype']}: {len(doc['variants'])} variants, "
                 f"{prot['rounds']} rounds, each variant once per round in a shuffled order (seed {prot['seed']}); a "
                 f"visit = {prot['warmup']} warm-up + {prot['iters']} timed calls per point, its sample the median; "
                 f"timer: {TIMER_WORDS.get(prot['timer'], prot['timer'])}; memory: {prot['memory_mode']}; ratios "
                 f"with paired bootstrap 95% CI over rounds ({doc['bootstrap']['resamples']} resamples).")
    if dev["type"] == "cpu":
        lines.append(f"NOTE: {CPU_NOTE}.")
    axis = doc.get("engine_axis")
    engine = doc.get("engine") or {"name": "torch"}
    groups = [(a["engine"], a["variants"]) for a in axis] if axis else [(engine, doc["variants"])]
    if axis:
        first = engine_label(axis[0]["engine"])
        lines.append(f"Engines (an axis of the rounds: every engine runs every variant, each against its own "
                     f"baseline, and against {first} in 'vs {first}'): "
                     f"{'; '.join(engine_words(a['engine']) for a in axis)}.")
    elif engine.get("name") != "torch":
        lines.append(f"Engine: {engine_words(engine)}.")
    for pt in doc["points"]:
        name = pt["name"]
        for k, (eng, variants) in enumerate(groups):
            lines.append("")
            where = f", {engine_label(eng)}" if axis or eng.get("name") != "torch" else ""
            lines.append(f"prefill, batch {pt['batch']}, S={pt['seq_len']}{where}:")
            head = ["Variant", "median ms", "vs baseline", "95% CI", "vs unaligned", "95% CI", "FLOPs ratio",
                    "align. eff.", "top kernel (share)", "SDPA"]
            if k:
                head[4:4] = [f"vs {engine_label(groups[0][0])}", "95% CI"]
            rows = []
            for v in variants:
                e = v["points"][name]
                top = e.get("top_kernels") or []
                row = [v["label"], f"{e['median_ms']:.2f}", "" if v["baseline"] else _pct(e["ratio_to_baseline"]),
                       "" if v["baseline"] else _ci(e["ratio_ci95"]), _pct(e["ratio_to_unaligned"]),
                       _ci(e["ratio_to_unaligned_ci95"]), f"{e['flops_ratio']:.3f}",
                       "" if v["baseline"] else f"{e['alignment_efficiency']:.2f}",
                       f"{top[0]['name'][:40]} ({top[0]['pct']:.0f}%)" if top else "",
                       ",".join(e.get("sdpa_backend") or [])]
                if k:
                    row[4:4] = [_pct(e.get("ratio_to_engine")), _ci(e.get("ratio_to_engine_ci95"))]
                rows.append(row)
            lines += _table(head, rows)
    if any(v.get("decode") for v in doc["variants"]):
        lines.append("")
        lines.append(f"decode, ms/token ({prot['decode_tokens']} new tokens after a {prot['decode_prompt']}-token prompt):")
        rows = [[v["label"], f"{v['decode']['ms_per_token']:.3f}",
                 "" if v["baseline"] else _pct(v["decode"]["ratio_to_baseline"]),
                 "" if v["baseline"] else _ci(v["decode"]["ratio_ci95"])] for v in doc["variants"] if v.get("decode")]
        lines += _table(["Variant", "ms/token", "vs baseline", "95% CI"], rows)
    lines.append("")
    lines.append("vs baseline / vs unaligned: latency change (ratio - 1); align. eff. = FLOPs ratio / latency ratio "
                 "(1.0: as fast as its FLOPs allow).")
    return "\n".join(lines)


def engine_label(engine: dict) -> str:
    """An engine as the table's headings name it: its name, with its type where it is not the engine's default
    (``llama.cpp:q4_K``; :func:`gac.align.engine_types.engine_spec`)."""
    from gac.align.engine_types import engine_spec

    return engine_spec(engine["name"], engine.get("quant"))


def engine_words(engine: dict) -> str:
    """An engine as a line names it: name, version, threads, and its quantized type where it has one."""
    threads = engine.get("threads")
    extra = [f"{threads} thread{'s' if threads != 1 else ''}" if threads else None,
             engine.get("quant") if engine.get("quant") not in (None, "f32") else None]
    return f"{engine['name']} {engine.get('version', '?')}" + "".join(f", {x}" for x in extra if x)


def _table(head, rows) -> list[str]:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return [fmt(head), fmt(["-" * w for w in widths]), *[fmt(r) for r in rows]]


def format_predicted(doc: dict) -> str:
    """The predicted column beside what the bench measured (a model of another GPU, not a measurement)."""
    pr = doc.get("predicted")
    if not pr:
        return ""
    measured = {}
    for v in doc.get("variants") or []:
        for name, e in (v.get("points") or {}).items():
            measured[(v.get("label"), name)] = e.get("median_ms")
    dev = (doc.get("device") or {}).get("name") or "this device"
    lines = [f"\n{pr['label']} (a model of that GPU, not a measurement) beside what {dev} measured:"]
    for name, p in pr["points"].items():
        lines.append(f"{name}:")
        lines.append(f"  {'variant':<28} {'measured ms':>12} {'predicted ms':>13} {'predicted vs baseline':>22}")
        for label, v in p["variants"].items():
            m = measured.get((label, name))
            rel = "" if v["ms"] == p["baseline_ms"] and label == next(iter(p["variants"])) else \
                f"{100 * (v['ms'] / p['baseline_ms'] - 1):+.1f}%"
            lines.append(f"  {label:<28} {'' if m is None else f'{m:.2f}':>12} {v['ms']:>13.2f} {rel:>22}")
    return "\n".join(lines)
