"""The fourth catalogue's cases that do not fit a row of docs/bad-input.md (exit 0 with a node left as it was, a
reader on a pipe, a second process's stdout, a result that must not change): every command's output file goes through
one rule (gac.io.check_output_file / write_output), --force replaces only what gac may replace, and the checks
added for checkpoints, tied weights, RoPE blocks, durations and sweeps refuse nothing that is fine.

Device nodes are made here with ``os.mknod`` in a temporary directory (major 1 minor 3 is what /dev/null is, minor
7 /dev/full); no test points an output at a real device."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gac.errors import GacError

ROOT = Path(__file__).resolve().parents[1]
ALLOC = {"budget": 1000, "targets": [{"name": "a", "d_star": 10.5, "score": 1, "params_per_dim": 10}]}
BENCH = ["--point", "1,16", "--rounds", "2", "--warmup", "0", "--iters", "1", "--bootstrap", "100", "--no-profile"]


def _chr(path: Path, minor: int = 3) -> Path:
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    return path


def _still_chr(path: Path, minor: int = 3) -> bool:
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, minor)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "alloc.json").write_text(json.dumps(ALLOC))
    (tmp_path / "plan.json").write_text(json.dumps({"dims": {"model.layers.0.self_attn.q_proj": 64}}))
    return tmp_path


def _commands(t: Path, out: Path) -> dict[str, list[str]]:
    return {
        "align -o": ["align", str(t / "alloc.json"), "-o", str(out)],
        "demo --save-allocation": ["demo", "--save-allocation", str(out)],
        "predict --json": ["predict", "--gpu", "a100", "--model", "tiny", "--json", str(out)],
        "bench --json": ["bench", "--plan", str(t / "plan.json"), "--model", "tiny", "--compressor", "asvd", *BENCH,
                         "--json", str(out)],
        "doctor --json": ["doctor", "--no-smoke", "--device", "cpu", "--json", str(out)],
        "evaluate --json": ["evaluate", "tiny", "--ppl", "--ppl-windows", "1", "--seq-len", "64", "--json", str(out)],
    }


@pytest.mark.parametrize("command", ["align -o", "demo --save-allocation", "predict --json", "bench --json",
                                     "doctor --json", "evaluate --json"])
def test_force_writes_into_a_character_device_and_leaves_it_one(command, files, capsys):
    """The issue's first wrong item: --force replaced a character device (/dev/full, as root) with a regular file."""
    from gac.cli import main

    dev = _chr(files / "null")
    assert main([*_commands(files, dev)[command], "--force"]) == 0, capsys.readouterr().err
    assert _still_chr(dev)
    assert main(_commands(files, dev)[command]) == 0  # a stream replaces nothing: no --force needed
    assert _still_chr(dev)


def test_a_full_device_is_one_line_and_stays_a_device(files, capsys):
    from gac.cli import main

    full = _chr(files / "full", minor=7)
    assert main(["align", str(files / "alloc.json"), "-o", str(full), "--force"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device; the disk is full" in err[0], err
    assert _still_chr(full, minor=7)


@pytest.mark.parametrize("target", ["/proc/self/fd/1", "/dev/fd/1"])
def test_a_link_to_stdout_is_written_as_the_stream_and_stays_a_link(target, files):
    """``--json /dev/stdout --force`` replaced /dev/stdout (a link to /proc/self/fd/1) with a regular file. Here the
    link is one made in the test, so a regression replaces only it; stdout is a file, the harder case (reopening
    it would write at another offset than the command's own prints)."""
    link = files / "stdout"
    link.symlink_to(target)
    with open(files / "captured.txt", "w") as out:
        p = subprocess.run([sys.executable, "-m", "gac.cli", "align", str(files / "alloc.json"), "-o", str(link),
                            "--force"], stdout=out, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    assert link.is_symlink() and os.readlink(link) == target
    text = (files / "captured.txt").read_text()
    assert text.rstrip().endswith(f"-> {link}")  # the summary line, after the plan: nothing overwritten
    plan = json.loads(text[: text.rindex("}") + 1])
    assert plan["dims"] == {"a": 16}


def test_a_named_pipe_is_written_to_its_reader_and_stays_a_pipe(files, capsys, monkeypatch):
    import builtins

    import gac.io
    from gac.cli import main

    fifo = files / "plan.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    said, gave_up = threading.Event(), threading.Event()

    def say(*a, **k):  # gac.io's print: set once the writer has said it waits for a reader
        builtins.print(*a, **k)
        if "waiting for a reader" in " ".join(map(str, a)):
            said.set()

    monkeypatch.setattr(gac.io, "print", say, raising=False)

    def reader():  # opens once the writer found no reader: it says so and waits, as the shell's `> fifo` does
        if said.wait(600) and not gave_up.is_set():
            with open(fifo, "rb") as f:
                got.append(f.read())

    t = threading.Thread(target=reader)
    t.start()
    try:
        assert main(["align", str(files / "alloc.json"), "-o", str(fifo)]) == 0
    finally:
        gave_up.set()  # a writer that never waited: the reader ends without opening (and the test fails below)
        said.set()
        t.join()
    assert json.loads(got[0])["dims"] == {"a": 16}
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert "waiting for a reader of the named pipe" in capsys.readouterr().err


def test_force_still_replaces_a_regular_file_and_a_link_to_one(files):
    """The positive side of the rule: a file gac may replace is replaced; a link is replaced, never written through."""
    from gac.cli import main

    old = files / "old.json"
    old.write_text("{}")
    other = files / "colleague.json"
    other.write_text("a colleague's file")
    link = files / "link.json"
    link.symlink_to(other)
    for path in (old, link):
        assert main(["align", str(files / "alloc.json"), "-o", str(path), "--force"]) == 0
        assert json.loads(path.read_text())["dims"] == {"a": 16} and not path.is_symlink()
    assert other.read_text() == "a colleague's file"


def test_the_rule_is_checked_again_at_the_write(tmp_path):
    """A path that became a device during the work is written to, not replaced: the check runs again at the write."""
    from gac.io import check_output_file, write_output

    p = tmp_path / "out.json"
    assert check_output_file(p, "--json") == "file"
    _chr(p)
    write_output(p, {"a": 1}, "--json", force=True)
    assert _still_chr(p)
    p2 = tmp_path / "late.json"
    check_output_file(p2, "--json")
    p2.write_text("someone else's")
    with pytest.raises(GacError, match="already exists"):
        write_output(p2, {"a": 1}, "--json")
    assert p2.read_text() == "someone else's"


def test_where_outputs_may_go(tmp_path):
    """No false refusals: a directory with a config.json but no weights is not a model, a directory with records/
    alone is not a store, and a new file at a store's top level (beside records/) is fine."""
    from gac.layout import owned_directory

    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "config.json").write_text("{}")  # some tool's config
    assert owned_directory(tmp_path / "project" / "out.json") is None
    (tmp_path / "notes" / "records").mkdir(parents=True)
    assert owned_directory(tmp_path / "notes" / "records" / "x.json") is None
    store = tmp_path / "store"
    (store / "records").mkdir(parents=True)
    (store / ".gac-store.json").write_text("{}")
    assert owned_directory(store / "bench.json") is None
    assert "records/ of the results store" in owned_directory(store / "records" / "x.json")
    assert "work/ of the results store" in owned_directory(store / "work" / "k" / "x.json")  # a new folder under it


def test_compress_force_replaces_its_own_checkpoint(tmp_path, capsys):
    """``gac compress -o CK --force`` on a checkpoint gac saved replaces it (the only directory it replaces)."""
    from gac.cli import main

    def compress(ratio: str, *extra: str) -> int:
        return main(["compress", "tiny", "--compressor", "svd_llm", "--ratio", ratio, "--calib-samples", "2",
                     "--calib-seq-len", "32", "-o", str(tmp_path / "ck"), *extra])

    assert compress("0.2") == 0
    first = json.loads((tmp_path / "ck" / "gac_checkpoint.json").read_text())["meta_sha256"]
    assert compress("0.3") == 2
    assert "already holds a gac checkpoint" in capsys.readouterr().err
    assert compress("0.3", "--force") == 0
    meta = json.loads((tmp_path / "ck" / "gac_checkpoint.json").read_text())
    assert meta["meta_sha256"] != first and meta["recipe"]["ratio"] == 0.3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temp or replaced directory left


def _tiny_checkpoint(path: Path, tokenizer=True) -> Path:
    import torch

    from gac.compression.checkpoint import save_checkpoint
    from gac.models import load_model

    model, tok = load_model("tiny", dtype=torch.float32)
    return save_checkpoint(model, tok if tokenizer else None, path)


def test_tokenizer_hashes_checked_and_escapable(tmp_path):
    """The tokenizer is verified like the weights; verify=False still loads a checkpoint one trusts; a checkpoint of
    the previous format without tokenizer files loads as before; save_pretrained after a tokenizer hashes it too."""
    from gac.compression.checkpoint_format import META_FILE, meta_sha256
    from gac.compression.checkpoint_load import load_checkpoint

    d = _tiny_checkpoint(tmp_path / "ck")
    meta = json.loads((d / META_FILE).read_text())
    assert meta["format_version"] == 3 and set(meta["tokenizer_files"]) >= {"tokenizer.json"}
    tok = json.loads((d / "tokenizer.json").read_text())
    v = tok["model"]["vocab"]
    v["Ġthe"], v["Ġa"] = v["Ġa"], v["Ġthe"]
    (d / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(GacError, match="tokenizer.json does not match the sha256"):
        load_checkpoint(d)
    _, t2 = load_checkpoint(d, verify=False)
    assert t2.convert_tokens_to_ids("Ġthe") == 260

    bare = _tiny_checkpoint(tmp_path / "bare", tokenizer=False)
    m = json.loads((bare / META_FILE).read_text())
    assert m["tokenizer_files"] == {}
    m.pop("tokenizer_files")
    m["format_version"] = 2
    m["meta_sha256"] = meta_sha256(m)
    (bare / META_FILE).write_text(json.dumps(m))
    load_checkpoint(bare)  # format 2 with no tokenizer files: nothing left uncovered


def test_a_tied_weight_stored_twice_with_equal_values_is_fine(tmp_path):
    from gac.models import check_model_files
    from tests.bad_input_fixtures_writes import _hf, _with_lm_head

    d = _hf(tmp_path, "same")
    _with_lm_head(d, 1.0)
    check_model_files(d)
    _with_lm_head(d, 0.8)
    with pytest.raises(GacError, match="'lm_head.weight', a tensor the config has no place for"):
        check_model_files(d)


@pytest.mark.parametrize("block", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192, "rope_theta": 500000.0},  # Llama 3.1
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},  # Qwen2.5 long context
    {"type": "linear", "factor": 4.0},  # a legacy rope_scaling block
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "longrope", "short_factor": [1.0, 1.1], "long_factor": [1.5, 2.0],
     "original_max_position_embeddings": 4096},  # Phi-3
    {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
     "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},  # one block per layer type (Gemma 3)
])
def test_real_rope_blocks_pass(block):
    from gac.untrusted import config_field_problem

    assert config_field_problem({"rope_parameters": block}) is None
    assert config_field_problem({"rope_scaling": block}) is None


@pytest.mark.parametrize("block,why", [
    ({"rope_type": "linear", "factor": -2}, "the linear RoPE scaling factor is -2"),
    ({"rope_type": "yarn", "factor": float("nan"), "original_max_position_embeddings": 4096}, "factor is nan"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}, "original_max_position_embeddings"),
    ({"rope_type": "yarn", "factor": 4.0, "attention_factor": -1.0}, "attention_factor is -1.0"),
    ({"rope_type": "longrope", "short_factor": [1.0, -1.0], "long_factor": [1.0, 1.0]}, "short_factor"),
    ({"sliding_attention": {"rope_type": "linear", "factor": 0.5}}, "sliding_attention: the linear RoPE"),
])
def test_bad_rope_blocks_are_named(block, why):
    from gac.untrusted import config_field_problem

    assert why in config_field_problem({"rope_parameters": block})


def test_zero_is_no_duration():
    from gac.compression.sensitivity import parse_duration

    for zero in ("0", "0s", "0.0", "0m", " 0 "):
        with pytest.raises(GacError, match="is not a duration > 0"):
            parse_duration(zero, "--sensitivity-limit")
    assert parse_duration("none") is None and parse_duration("off") is None and parse_duration("1s") == 1


def test_a_sweep_over_experiment_is_refused_and_one_experiment_still_sweeps():
    from gac.jobs.sweep.points import expand_sweep

    for sweep in (["experiment=table5,ratio_sweep"], ["experiment=glob(table5*)"]):
        with pytest.raises(GacError, match="each experiment is a sweep of its own"):
            expand_sweep(sweep)
    jobs = expand_sweep(["experiment=ratio_sweep"], {"ratio": "0.1,0.2"})
    assert jobs == [["ratio=0.1", "experiment=ratio_sweep"], ["ratio=0.2", "experiment=ratio_sweep"]]


def test_a_fixture_folder_gac_built_is_replaced_with_force_only(tmp_path):
    from gac.commands.fixtures import check_build_out

    d = tmp_path / "built"
    d.mkdir()
    (d / "provenance.json").write_text(json.dumps({"recipe_hash": "abc"}))
    check_build_out(d, True, "tiny")
    with pytest.raises(GacError, match="already exists; pass --force"):
        check_build_out(d, False, "tiny")
    check_build_out(tmp_path / "new", False, "tiny")
