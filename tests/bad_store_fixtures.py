"""The files the "Store, records and models" rows of docs/bad-input.md name: damaged copies of a results store, of a
gac checkpoint and of a Hugging Face model directory, each built once per test session from real ones (the analysis
fixture store, a checkpoint saved from ``tiny`` with one low-rank projection, ``tiny``'s own HF directory). Large
files are hard-linked, not copied, where a case leaves them unchanged."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "tests" / "analysis" / "fixtures" / "store"
RECORD = "a015000000000000"  # a completed record of the fixture store (ASVD, unaligned, ratio 0.15)
BASELINE = ["compressor=none", "eval=none"]  # the run.py rows: a baseline that would load tiny and write a record


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc, indent=1))


def _link_copy(src: Path, dst: Path, link=(".safetensors",)) -> Path:
    """A copy of directory ``src`` whose large files (``link`` suffixes) are hard links (copied if links fail)."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            if f.suffix in link:
                try:
                    os.link(f, dst / f.name)
                    continue
                except OSError:
                    pass
            shutil.copy2(f, dst / f.name)
    return dst


def _stores(T: Path) -> None:
    rec = lambda d: T / d / "records" / f"{RECORD}.json"  # noqa: E731

    def store(name: str) -> Path:
        d = T / name
        shutil.copytree(STORE, d)
        return d

    d = store("st_copied")  # a record copied under another name, its metrics x10 and an accuracy of 8 (issue item 1)
    doc = json.loads(rec("st_copied").read_text())
    doc["metrics"] = {k: v * 10 for k, v in doc["metrics"].items()}
    doc["metrics"]["piqa_acc"] = 8.0
    (d / "records" / "ffffffffffffffff.json").write_text(json.dumps(doc))
    store("st_acc")
    _edit_json(rec("st_acc"), lambda r: r["metrics"].update(piqa_acc=8.0))
    store("st_ppl")
    _edit_json(rec("st_ppl"), lambda r: r["metrics"].update(ppl_wikitext2=0.5))
    store("st_trunc")
    text = rec("st_trunc").read_text()
    rec("st_trunc").write_text(text[: len(text) // 2])
    store("st_nan")
    rec("st_nan").write_text(rec("st_nan").read_text().replace('"ppl_wikitext2": 30.0', '"ppl_wikitext2": NaN'))
    store("st_inf")
    rec("st_inf").write_text(rec("st_inf").read_text().replace('"ppl_wikitext2": 30.0', '"ppl_wikitext2": 1e400'))
    store("st_bytes")
    rec("st_bytes").write_bytes(rec("st_bytes").read_bytes().replace(b'"tiny"', b'"ti\xffny"', 1))
    store("st_dir")
    (T / "st_dir" / "records" / "0123456789abcdef.json").mkdir()
    store("st_link_out")
    shutil.copy(rec("st_link_out"), T / "outside.json")
    _edit_json(T / "outside.json", lambda r: r.update(key="eeeeeeeeeeeeeeee"))
    (T / "st_link_out" / "records" / "eeeeeeeeeeeeeeee.json").symlink_to(T / "outside.json")
    store("st_loop")
    loop = T / "st_loop" / "records" / "1111111111111111.json"
    loop.symlink_to(loop)
    d = store("st_records_file")
    shutil.rmtree(d / "records")
    (d / "records").write_text("not a directory\n")
    d = store("st_records_link")
    shutil.copytree(d / "records", T / "other_records")
    shutil.rmtree(d / "records")
    (d / "records").symlink_to(T / "other_records")
    store("st_minimal")
    rec("st_minimal").write_text(json.dumps({"key": RECORD, "status": "completed", "job": {}}))
    store("st_string")
    _edit_json(rec("st_string"), lambda r: r["metrics"].update(piqa_acc="0.9"))
    store("st_latency")
    _edit_json(rec("st_latency"), lambda r: r["metrics"].update(prefill_ms=-5.0))
    store("st_ratio")
    _edit_json(rec("st_ratio"), lambda r: r["job"].update(ratio=15))
    store("st_status")
    _edit_json(rec("st_status"), lambda r: r.update(status="failed"))
    d = store("st_rerun")
    shutil.copy(rec("st_rerun"), d / "records" / f"{RECORD}.rerun-20250103T000000.000000Z.json")
    _edit_json(d / "records" / f"{RECORD}.rerun-20250103T000000.000000Z.json", lambda r: r.update(key="a0150000000000ff"))
    d = store("st_huge")
    with open(d / "records" / "2222222222222222.json", "wb") as f:  # sparse: 300 MiB on paper, nothing on disk
        f.truncate(300 << 20)
    (T / "st_looping").symlink_to(T / "st_looping")  # a results directory that is a link to itself
    d = store("st_bench")
    (d / "bench").mkdir()
    (d / "bench" / "abcdabcdabcdabcd.json").write_text(json.dumps({
        "kind": "bench", "key": "abcdabcdabcdabcd", "points": [{"name": "prefill_ms@1024", "batch": 1, "seq_len": 1024}],
        "variants": [{"record_key": RECORD, "points": {"prefill_ms@1024": {"median_ms": "fast"}}}]}))


def baseline_key() -> str:
    """The key of the point the experiments/run.py rows run (``BASELINE``'s overrides)."""
    from omegaconf import OmegaConf

    from gac.jobs.config.command_line import compose_config
    from gac.jobs.config.build import spec_from_config

    return spec_from_config(OmegaConf.to_container(compose_config(BASELINE), resolve=True)).key


def empty_store(T: Path, name: str) -> Path:
    """An empty results store ``T/name`` (its marker and records/), for a row to damage."""
    d = T / name
    (d / "records").mkdir(parents=True)
    (d / ".gac-store.json").write_text(json.dumps({"format": "gac-results-store", "schema": 1}))
    return d


def _run_stores(T: Path) -> None:
    """Stores for the experiments/run.py rows: the baseline point's key with a damaged entry of each kind."""
    key = baseline_key()

    def store(name: str) -> Path:
        return empty_store(T, name)

    d = store("run_minimal")  # a hand-made record that made run.py skip the point (issue: "No clear message")
    (d / "records" / f"{key}.json").write_text(json.dumps({"key": key, "status": "completed", "job": {}}))
    d = store("run_records_file")
    (d / "records").rmdir()
    (d / "records").write_text("not a directory\n")
    d = store("run_lock_dir")
    (d / "locks" / f"{key}.lock").mkdir(parents=True)
    d = store("run_attempts_text")
    (d / "work" / key).mkdir(parents=True)
    (d / "work" / key / "attempts.json").write_text('{"attempts": [')
    d = store("run_attempts_list")
    (d / "work" / key).mkdir(parents=True)
    (d / "work" / key / "attempts.json").write_text("[1, 2]")
    d = store("run_work_file")
    (d / "work").mkdir()
    (d / "work" / key).write_text("not a directory\n")
    d = store("run_events_dir")
    (d / "runs" / f"{key}.jsonl").mkdir(parents=True)


def _checkpoints(T: Path) -> None:
    """A gac checkpoint of tiny with layer 0's q_proj factorised at rank 104 (the low-rank module a rank edit
    breaks), saved by this gac, and damaged copies of it."""
    import torch

    from gac.compression.checkpoint import save_checkpoint
    from gac.compression.modules import LowRankLinear, get_module
    from gac.compression.swap import replace_module
    from gac.models import load_model

    model, tok = load_model("tiny", dtype=torch.float32)
    name = "model.layers.0.self_attn.q_proj"
    w = get_module(model, name).weight.detach()
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    r = 104
    replace_module(model, name, LowRankLinear.from_factors((u[:, :r] * s[:r]).contiguous(), vh[:r].contiguous()))
    good = save_checkpoint(model, tok, T / "ck")
    other = T / "ck_other"  # the same shapes, other values: what "weights from another checkpoint" looks like
    with torch.no_grad():
        get_module(model, name).up.weight.mul_(1.01)
    save_checkpoint(model, tok, other)

    def ck(case: str, edit=None) -> Path:
        d = _link_copy(good, T / f"ck_{case}")
        if edit is not None:
            _edit_json(d / "gac_checkpoint.json", edit)
        return d

    ck("int8", lambda m: m.update(dtype="int8"))
    ck("fp16", lambda m: m.update(dtype="float16"))
    ck("rank", lambda m: m["modules"][name].update(rank=100))
    ck("hidden", lambda m: m["base_config"].update(hidden_size=320))
    ck("gpt2", lambda m: m["base_config"].update(model_type="gpt2"))
    ck("rope", lambda m: m["base_config"]["rope_parameters"].update(rope_theta=500000.0))
    ck("up", lambda m: m["weights"].update(file="../ck_other/gac_model.safetensors"))
    ck("abs", lambda m: m["weights"].update(file=str(other / "gac_model.safetensors")))
    ck("version", lambda m: m.update(format_version="abc"))
    ck("modules", lambda m: m.update(modules=["q_proj"]))

    def unhashed(m):  # the config's hash deleted, then rope_theta and rms_norm_eps edited
        m.pop("meta_sha256")
        m["base_config"]["rope_parameters"].update(rope_theta=5.0)
        m["base_config"].update(rms_norm_eps=0.5)

    ck("nohash", unhashed)
    ck("noweighthash", lambda m: m["weights"].pop("sha256"))
    ck("format1", lambda m: m.update(format_version=1))
    d = ck("tok")
    text = (d / "tokenizer.json").read_text()
    (d / "tokenizer.json").unlink()
    (d / "tokenizer.json").write_text(text[:5000])
    d = ck("link")
    (d / "gac_model.safetensors").unlink()
    (d / "gac_model.safetensors").symlink_to(other / "gac_model.safetensors")
    d = ck("swapped")
    (d / "gac_model.safetensors").unlink()
    shutil.copy(other / "gac_model.safetensors", d / "gac_model.safetensors")


def copy_tiny_hf(src: Path, d: Path) -> None:
    """tiny's Hugging Face files from ``src`` into the made directory ``d``, its weights hard-linked where possible."""
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        if f == "model.safetensors":
            try:
                os.link(src / f, d / f)
                continue
            except OSError:
                pass
        shutil.copy(src / f, d / f)


def _hf_dirs(T: Path) -> None:
    """Copies of tiny's own Hugging Face directory whose weights no longer match their config."""
    from safetensors.torch import load_file, save_file

    from gac.fixtures.tiny import tiny_dir

    src = tiny_dir()

    def hf(case: str, **config) -> Path:
        d = T / f"hf_{case}"
        d.mkdir()
        copy_tiny_hf(src, d)
        if config:
            _edit_json(d / "config.json", lambda c: c.update(config))
        return d

    d = hf("missing")
    sd = load_file(str(src / "model.safetensors"))
    del sd["model.layers.1.mlp.up_proj.weight"]
    (d / "model.safetensors").unlink()
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    hf("layers6", num_hidden_layers=6)
    hf("layers2", num_hidden_layers=2)
    hf("hidden", hidden_size=320)
    hf("type", model_type="llamma")
    d = hf("config_text")
    (d / "config.json").write_text('{"model_type": "llama", ')
    d = hf("remote_code")  # a tokenizer that names Python shipped beside it (which would write a marker)
    (d / "evil.py").write_text(f"open({str(T / 'ran_remote_code')!r}, 'w').write('ran')\n")
    _edit_json(d / "tokenizer_config.json", lambda c: c.update(auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]}))
    d = hf("trunc")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").write_bytes(data[: len(data) // 3])


def store_files(T: Path) -> None:
    """Every input of the "Store, records and models" rows, under ``T``."""
    _stores(T)
    _run_stores(T)
    _checkpoints(T)
    _hf_dirs(T)
