"""Each concept of gac has one definition, and everything reads it: the tests below fail when a copy comes back
(a literal, a re-declared constant, a hand-written helper beside gac's own) or when two readers of a concept
disagree (the default window, a baseline's pass through ``--where``, the clock of a CPU timing, "is a number")."""

import ast
import functools
import math
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
GAC = ROOT / "gac"


@functools.cache
def _sources() -> tuple[tuple[str, str], ...]:
    return tuple((path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))
                 for path in sorted(GAC.rglob("*.py")))


@functools.cache
def _strings(text: str) -> tuple[tuple[int, str], ...]:
    """The string constants of a module's code (docstrings excluded: prose may name what the code spells once)."""
    tree = ast.parse(text)
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return tuple((node.lineno, node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs)


def _where(pattern: str, allowed: tuple[str, ...], strings: bool = False) -> list[str]:
    """``file:line`` of every match of ``pattern`` outside the ``allowed`` files (and folders ending in ``/``):
    in the code's string constants with ``strings``, else in the source text."""
    rx = re.compile(pattern)
    hits = []
    for rel, text in _sources():
        if rel in allowed or any(rel.startswith(a) for a in allowed if a.endswith("/")):
            continue
        if strings:
            hits += [f"{rel}:{line}" for line, s in _strings(text) if rx.search(s)]
        else:
            hits += [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}" for m in rx.finditer(text)]
    return hits


@pytest.mark.parametrize("pattern,home,strings,what", [
    (r'removeprefix\("torch\."\)|replace\("torch\.", ""\)', ("gac/dtypes.py",), False,
     "a dtype's name: gac.dtypes.dtype_str"),
    (r"gac_checkpoint\.json", ("gac/layout.py",), True,
     "the checkpoint's file: gac.layout.CHECKPOINT_FILE"),
    (r"^\.gac-store\.json$", ("gac/layout.py",), True, "the results store's marker: gac.layout.STORE_MARKER"),
    (r"(?m)^\s*def _?(is_store|is_model_dir)\b", ("gac/layout.py",), False,
     "is this a results store / a model directory: gac.layout.is_store (to_read: any of its directories)"),
    (r"^tiny-untrained$", ("gac/registry.py", "gac/fixtures/"), True, "the named models: gac.registry.NAMED_MODELS"),
    (r"^Baseline$", ("gac/registry.py",), True, "the baseline's label: gac.registry.BASELINE_LABEL"),
    (r"\bhashlib\b", ("gac/hashing.py",), False, "hashing: gac.hashing.digest (file_sha256 for a file)"),
    (r"\bfcntl\b", ("gac/machine.py",), False, "a lock of this machine: gac.machine.host_lock"),
    (r"def _?pid_alive|def _?pid_start", ("gac/machine.py",), False, "process liveness: gac.machine.pid_alive"),
    (r"gethostname|platform\.node\(|uname\(\)\.nodename", ("gac/machine.py",), False,
     "the host: gac.machine.host/hostname"),
    (r"%Y-%m-%dT|isoformat\(timespec", ("gac/machine.py",), False, "a time stamp: gac.machine.utc_stamp"),
    (r"%Y%m%dT|\blocaltime\(", ("gac/machine.py",), False, "a time stamp in a file name: gac.machine.file_stamp (UTC)"),
    (r"(?m)^LOSS_CHUNK_BYTES\s*=", ("gac/compression/footprint.py",), False, "the loss's chunk: footprint's"),
    (r"(?m)^\s*BASELINE\s*=|compressor\"?\]?\)? ?[!=]= \"none\"", ("gac/registry.py",), False,
     "the baseline's name: gac.registry.BASELINE"),
    (r"(?m)^def (is_baseline|_?is_num)", ("gac/registry.py", "gac/results/query.py"), False,
     "is it the baseline / a number: gac.registry.is_baseline, gac.results.query.is_number"),
    (r"(?m)^def _?(device_of|model_device)\b|next\(\w+\.parameters\(\)\)\.device", ("gac/devices.py",), False,
     "the device a model's inputs go to: gac.devices.model_device"),
    (r"^rev-parse$", ("gac/provenance.py",), True, "gac's checkout: gac.provenance.checkout / git_commit"),
    (r"time\.thread_time_ns|time\.thread_time\b", ("gac/evaluation/latency.py",), False,
     "the CPU clocks by name: gac.evaluation.latency.CPU_CLOCKS / CPU_CLOCKS_NS"),
    (r'"HF_HOME"\)|"\.cache"[,/ ]+"huggingface"|\.cache/huggingface', ("gac/hub.py",), False,
     "Hugging Face's home (its caches, the token file): gac.hub.hf_home"),
    (r"def _?(hub_(endpoint|unreachable|access|token|cache|repo|dataset)|proxy_for)|HfApi\(|get_session\("
     r"|get_token\(|\"HF_(ENDPOINT|HUB_CACHE|DATASETS_CACHE|TOKEN_PATH)\"\)|\"HF_HUB_OFFLINE\", \"HF_DATASETS_OFFLINE\"\)"
     r"|\bs--\{|replace\(./., .(--|___).\)|\"snapshots\"", ("gac/hub.py",), False,
     "the Hugging Face hub (its address, whether it answers, the token, its caches and their layout): gac.hub"),
    (r"\bcomp\w*\.name\s*(==|!=|in\b)", ("gac/compression/compressors/", "gac/registry.py"), False,
     "what a compressor needs is the compressor's to say (its attributes), not a branch on its name"),
    (r"\* F\.linear\(", ("gac/profiling/sweeps.py",), False,
     "a width target's kernels: gac.profiling.sweeps.width_kernels"),
    (r"gac_export\.json|already holds an? (gac )?(export|checkpoint)", ("gac/export/hf.py",
     "gac/compression/checkpoint.py"), True, "a model directory gac writes: gac.compression.checkpoint.check_output_dir"),
    (r"\bn_samples\b.{0,4}\b32\b|calibration\w*\W{1,4}seq_len\b.{0,4}\b2048\b|default=32\)", ("gac/text.py",), False,
     "calibration by default: gac.text.CALIBRATION_SAMPLES / CALIBRATION_SEQ_LEN"),
    (r"supports_sensitivity", ("gac/compression/preparation.py", "gac/compression/compressors/"), False,
     "is this allocation available for the compressor: gac.compression.preparation.check_allocation"),
    (r"^marginal$", ("gac/registry.py",), True, "the knapsack score by default: gac.registry.DEFAULT_KNAPSACK_SCORE"),
    (r"\bunit: int = \d", ("gac/align/candidates.py",), False, "the alignment unit by default: DEFAULT_UNIT"),
    (r"\bOWN_CANDIDATES\s*=", ("gac/align/strategies.py",), False,
     "the strategies with candidates of their own: gac.align.strategies.OWN_CANDIDATES"),
    (r"\"git\": \{", ("gac/provenance.py",), False, "a result's provenance: gac.provenance.provenance"),
    (r"\bJobSpec\(", ("gac/jobs/config/build.py",), False,
     "a job built from a config, as every entry point builds it: gac.jobs.config.build.job_from_config (command_config "
     "for a command's flags)"),
    (r"\bcheck_allocation\(", ("gac/jobs/config/build.py", "gac/compression/preparation.py"), False,
     "is this compression request valid: gac.jobs.config.build.check_compression"),
    (r"thread_time\b", ("gac/evaluation/latency.py", "gac/profiling/timing.py", "gac/evaluation/bench.py",
                        "gac/evaluation/bench_format.py", "gac/evaluation/bench_stats.py"), False,
     "the CPU clock rule: gac.evaluation.latency.timer_for"),
    (r'get\("created"\) or ""\), str\(\w+\.get\("path"\)', ("gac/analysis/benches.py",), False,
     "which side-by-side bench is the latest: gac.analysis.benches.latest_bench"),
])
def test_no_copy_outside_its_one_definition(pattern, home, strings, what):
    hits = _where(pattern, home, strings)
    assert not hits, f"{what} is written out again at: {', '.join(hits)}"


def _store_dir_tuples(text: str) -> list[int]:
    """Lines of a module's tuple, list or set literals that spell four or more of a results store's own directories:
    a copy of the store's layout (``STORE_DIRS`` had five names, the outputs' rule four, ``STORE_OWN_DIRS`` eight)."""
    from gac.layout import STORE_OWN_DIRS

    return [node.lineno for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.Tuple, ast.List, ast.Set))
            and sum(isinstance(e, ast.Constant) and e.value in STORE_OWN_DIRS for e in node.elts) >= 4]


def test_the_store_layout_is_spelled_once():
    assert _store_dir_tuples('STORE_DIRS = ("records", "failures", "runs", "work", "locks")') == [1]
    assert _store_dir_tuples('any((d / x).is_dir() for x in ("failures", "runs", "locks", "work"))') == [1]
    assert _store_dir_tuples('d in ("records", "bench", "sweeps")') == []  # a few of them, for one purpose
    bad = [f"{rel}:{line}" for rel, text in _sources() if rel != "gac/layout.py" for line in _store_dir_tuples(text)]
    assert not bad, f"a results store's directories are gac.layout.STORE_DIRS / STORE_OWN_DIRS: {', '.join(bad)}"


def test_one_rule_says_what_is_a_results_store(tmp_path):
    """Reading a store (:meth:`ResultsStore.exists`) and keeping outputs out of one (:func:`owned_directory`) ask
    :func:`gac.layout.is_store`: a store is its marker, or, read, any of its directories; for where outputs go,
    records/ beside another of them (a user's folder with a records/ of its own is not a store)."""
    from gac.layout import STORE_DIRS, STORE_MARKER, is_store, owned_directory
    from gac.results import ResultsStore

    cases = {"empty": (), "marker": (STORE_MARKER,), "records": ("records",), "runs": ("runs",),
             "records_work": ("records", "work"), "records_cache": ("records", "cache")}
    for name, entries in cases.items():
        d = tmp_path / f"case_{name}"  # named so that tmp_path itself is no store
        d.mkdir()
        for e in entries:
            if e == STORE_MARKER:
                (d / e).write_text("{}")
            else:
                (d / e).mkdir()
        read = bool(entries) and (STORE_MARKER in entries or any(e in STORE_DIRS for e in entries))
        strict = STORE_MARKER in entries or ("records" in entries and any(e in STORE_DIRS[1:] for e in entries))
        assert ResultsStore(d).exists() is is_store(d, to_read=True) is read, name
        assert is_store(d) is strict, name
        assert (owned_directory(d / "records" / "x.json") is not None) is strict, name


def test_atomic_writes_go_through_gac_io():
    """A file published by rename outside gac.io is a hand-written atomic write; the renames left are of whole
    directories (a fixture build, a checkpoint, an offline W&B run moved aside) or of files built as a set in a
    temp directory (tiny's task files)."""
    publishes = {"gac/fixtures/_build.py": "publish", "gac/compression/checkpoint.py": "save_checkpoint",
                 "gac/jobs/tracking/loggers.py": "_drop_partial_offline_runs", "gac/fixtures/tiny.py": "remake_task_files"}
    bad = []
    for rel, text in _sources():
        if rel == "gac/io.py":
            continue
        tree = ast.parse(text)
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
                name, base = call.func.attr, call.func.value
                moves = (name in ("replace", "rename") and isinstance(base, ast.Name) and base.id == "os") or (
                    name == "rename" and not call.keywords and len(call.args) == 1)  # os.replace, Path.rename
                if moves and publishes.get(rel) != fn.name:
                    bad.append(f"{rel}:{call.lineno} ({fn.name})")
    assert not bad, f"publish files with gac.io.write_text_atomic / write_json_atomic / replace_file: {bad}"


def test_tables_and_figures_are_written_atomically():
    """A figure (``savefig``) or a table (``to_csv`` to a path) is written through :func:`gac.io.replace_file` or
    made as text for :func:`gac.io.write_text_atomic`: a killed writer never leaves half a file under its name."""
    bad = []
    for rel, text in _sources():
        for n, line in enumerate(text.splitlines(), 1):
            if ("savefig(" in line or ".to_csv(" in line) and "replace_file(" not in line and \
                    not re.search(r"\.to_csv\(index=", line):
                bad.append(f"{rel}:{n}")
    assert not bad, f"write these through gac.io.replace_file / write_text_atomic: {bad}"


def _own_loads_and_evaluations(text: str) -> list[int]:
    """Lines of a module that load a model (``gac.models.load_model``) or run the evaluation
    (``gac.evaluation.suite.evaluate``) themselves: imported by name, or called through their module."""
    lines = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom):
            names = {a.name for a in node.names}
            if (node.module == "gac.models" and "load_model" in names) or (
                    node.module == "gac.evaluation.suite" and "evaluate" in names):
                lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and (node.attr == "load_model" or (
                node.attr == "evaluate" and isinstance(node.value, ast.Name) and node.value.id == "suite")):
            lines.append(node.lineno)
    return lines


def test_commands_load_and_evaluate_through_the_recipe():
    """``gac compress``, ``gac evaluate`` and ``gac export`` load their model with the recipe's ``load`` step
    (:func:`gac.jobs.run.loading.load_job_model`: one dtype and verify rule) and measure with its ``evaluate`` step
    (:func:`gac.jobs.run.recipe.evaluation_arguments`: the one place an EvalSpec becomes the evaluation's
    arguments), never with their own call of ``load_model`` or ``suite.evaluate``."""
    assert _own_loads_and_evaluations("from gac.models import describe, load_model\n") == [1]  # the scan sees one
    assert _own_loads_and_evaluations("import gac.evaluation.suite as suite\nsuite.evaluate(m, t)\n") == [2]
    assert _own_loads_and_evaluations("from gac.evaluation.suite import GROUPS\n") == []
    bad = [f"{rel}:{line}" for rel, text in _sources() if rel.startswith("gac/commands/")
           for line in _own_loads_and_evaluations(text)]
    assert not bad, f"load and evaluate through gac.jobs.run.recipe.Recipe (load, evaluate): {', '.join(bad)}"


# ---------------------------------------------------------------------------------------------- the window
def test_one_default_window_for_the_library_the_configs_and_the_job():
    from dataclasses import fields

    from gac.align.candidates import DEFAULT_WINDOW
    from gac.cli import build_parser
    from gac.jobs.config.compose import compose
    from gac.jobs.config.schema import AlignConfig, register
    from gac.jobs.config.spec import JobSpec

    spec_default = next(f.default for f in fields(JobSpec) if f.name == "window")
    assert AlignConfig().window == spec_default == DEFAULT_WINDOW == 1  # the paper's configs: the bracketing dims
    for path in sorted((ROOT / "conf" / "align").glob("*.yaml")):
        assert "window" not in (yaml.safe_load(path.read_text()) or {}), f"{path.name} sets its own window"
    register()
    for path in sorted((ROOT / "conf" / "align").glob("*.yaml")):
        assert compose("config", [f"align={path.stem}"]).align.window == DEFAULT_WINDOW, path.stem
    args = build_parser().parse_args(["compress", "tiny", "--compressor", "asvd", "--ratio", "0.1", "-o", "x"])
    assert args.window == DEFAULT_WINDOW


def test_one_evaluation_batch_for_the_job_gac_evaluate_and_the_suite():
    """A job, ``gac evaluate`` and :func:`gac.evaluation.suite.evaluate` batch perplexity windows and lm-eval
    requests alike (they were 8, 1/16 and 1/16)."""
    import inspect
    from dataclasses import fields

    from gac.evaluation.suite import EVAL_BATCH_SIZE, evaluate
    from gac.jobs.config.compose import compose
    from gac.jobs.config.schema import register
    from gac.jobs.config.spec import EvalSpec

    params = inspect.signature(evaluate).parameters
    assert params["ppl_batch_size"].default == params["task_batch_size"].default == EVAL_BATCH_SIZE
    assert next(f.default for f in fields(EvalSpec) if f.name == "batch_size") == EVAL_BATCH_SIZE
    register()
    for name in ("default", "none"):
        assert compose("config", [f"eval={name}"]).eval.batch_size == EVAL_BATCH_SIZE, name
    assert not _where(r"batch_size or \d", ())  # gac evaluate's flag falls back to the one default


def test_one_decode_prompt_for_the_job_gac_evaluate_and_the_suite():
    """The prompt decode latency starts from: a job's ``eval.decode_prompt``, ``gac evaluate --decode-prompt`` and
    :func:`gac.evaluation.suite.evaluate` by default, and what the job's length check adds (it said 128 itself)."""
    import inspect

    from gac.cli import build_parser
    from gac.evaluation.suite import DECODE_PROMPT, evaluate
    from gac.jobs.config.spec import EvalSpec

    assert inspect.signature(evaluate).parameters["decode_prompt"].default == EvalSpec().decode_prompt == DECODE_PROMPT
    assert build_parser().parse_args(["evaluate", "tiny"]).decode_prompt == DECODE_PROMPT
    assert not _where(r"decode_tokens \+ 128|128 \+ \w*decode_tokens", ())


def test_one_rule_for_the_experiments_that_end_in_table_5():
    """The end-of-sweep job shows Table 5 for exactly the experiments whose report has one."""
    from gac.analysis.report_dir import EXPERIMENT_ARTEFACTS, defines

    assert not _where(r"TABLE5_EXPERIMENTS|\(\"table5\", \"table5_authors\"", ("gac/analysis/report_dir.py",))
    assert {e for e in EXPERIMENT_ARTEFACTS if defines(e, "table5")} == {
        "table5", "table5_authors", "table5_both", "latency_budget"}
    assert not defines("ratio_sweep", "table5") and not defines(None, "table5")


# ---------------------------------------------------------------------------------------------- low rank
def test_a_compressors_low_rank_kind_is_its_units_kind():
    """The memory estimate reads ``low_rank`` from the compressor class; it must say what its units are."""
    from gac.compression.compressors import COMPRESSORS
    from gac.compression.discovery import discover
    from gac.models import load_model

    model, _ = load_model("tiny", dtype=torch.float32)
    layout = discover(model)
    for name, cls in COMPRESSORS.items():
        kinds = {u.kind for u in cls().units(model, layout)}
        assert cls.low_rank == ("lowrank" in kinds), (name, kinds)


def test_stable_rank_svd_memory_estimate_counts_its_factorisation():
    from gac.compression.discovery import discover_config
    from gac.compression.footprint import estimate_footprint
    from gac.fixtures import named_config

    config = named_config("tiny")
    srs = estimate_footprint(config, "stable_rank_svd", seq_len=256, params=1000)
    asvd = estimate_footprint(config, "asvd", seq_len=256, params=1000, compressor_options={"svd": "exact"})
    # the same exact SVD per weight, but stable_rank_svd keeps its factors at full rank min(out, in) (no weight stays
    # dense), ASVD up to the break-even rank: the compressor says which (Compressor.factor_rank)
    lay = discover_config(config)
    full = sum(min(p.out_features, p.in_features) * (p.out_features + p.in_features) * 4 for p in lay.projections)
    assert srs.factors == full > asvd.factors > 0 and srs.factorization > asvd.factorization > 0
    # and its allocation's SVD of every Linear, the LM head's the largest, is its own scoring term
    assert srs.at_head >= 4 * lay.vocab_size * lay.hidden_size and asvd.at_head == 0
    assert estimate_footprint(config, "llm_pruner", seq_len=256, params=1000).factors == 0


# ---------------------------------------------------------------------------------------------- numbers, keys, time
@pytest.mark.parametrize("value,number,finite", [
    (1, True, True), (1.5, True, True), (np.float32(2.0), True, True), (np.int64(3), True, True),
    (True, False, False), (math.nan, True, False), (math.inf, True, False), ("1.5", False, False), (None, False, False),
])
def test_one_rule_decides_what_is_a_number(value, number, finite):
    from gac.results.query import is_number, number_of
    from gac.results.validate import record_problem

    assert is_number(value) is number and is_number(value, finite=True) is finite
    rec = {"key": "k", "status": "completed", "created": "2025-01-01T00:00:00Z", "metrics": {},
           "job": {"model": "m", "compressor": "asvd", "strategy": "gac"}, "aligned_fraction": value}
    # the store's check: a finite number in [0, 1] (None: not measured)
    assert (record_problem(rec, "k") is None) is (value is None or finite and 0 <= float(value) <= 1)
    assert number_of("1.5") == 1.5 and number_of(True) is None and number_of("x") is None


def test_keys_and_names_stored_yesterday_are_still_found():
    """The one hashing helper gives every stored name the digits it had (values computed before it existed)."""
    from gac.fixtures.tiny import recipe_hash
    from gac.profiling.job_profile import cache_name
    from gac.results.keys import config_key

    assert config_key({"a": 1, "b": [1.5, "x"], "c": {"d": None}}) == "dcbeae96628dbd6a"
    assert cache_name({"device_name": "NVIDIA H100", "x": 1}, "float16") == "nvidia-h100-float16-cd643c274b"
    assert len(recipe_hash()) == 16


def test_times_and_hosts_are_written_one_way():
    from gac.jobs.run.provenance import attempt_info
    from gac.machine import TIME_FORMAT, host, parse_stamp, utc_stamp
    from gac.profiling.device import device_info
    from gac.provenance import provenance

    prov, dev = provenance(), device_info(torch.device("cpu"))
    for stamp in (prov["date"], dev["date"], attempt_info()["started"], utc_stamp()):
        assert time.strftime(TIME_FORMAT, time.gmtime(parse_stamp(stamp))) == stamp
    assert prov["hostname"] == dev["host"] == attempt_info()["host"] == host()
    assert parse_stamp("2025-01-01T00:00:00Z") == parse_stamp("2025-01-01T00:00:00+00:00") == 1735689600.0
    assert parse_stamp("yesterday") is None


# ---------------------------------------------------------------------------------------------- processes, devices
def test_a_temp_file_whose_pid_now_belongs_to_a_later_process_is_a_leftover(tmp_path):
    """The writer of a temp file named with this process's pid, written before this process started, is gone (the
    pid was reused), as a lock's holder is."""
    from gac.io import clean_temp_files, temp_path
    from gac.machine import pid_alive, pid_start

    old = temp_path(tmp_path / "record.json")
    old.write_text("{}")
    os.utime(old, (time.time() - 10 * 86400, time.time() - 10 * 86400))  # long before this process started
    mine = temp_path(tmp_path / "other.json")
    mine.write_text("{}")
    assert pid_alive(os.getpid(), pid_start(os.getpid())) and not pid_alive(os.getpid(), "1")
    assert clean_temp_files(tmp_path, max_age_s=1e9) == [old] and mine.exists()


def test_model_loading_checks_a_cuda_index_as_the_bench_does(monkeypatch):
    from gac.errors import GacError
    from gac.evaluation.bench_device import check_device
    from gac.models import _check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for check in (_check_device, check_device):
        with pytest.raises(GacError, match=r"'cuda:3' is not there: this machine has 1 GPU"):
            check("cuda:3")
    assert _check_device("cuda") == "cuda" and str(check_device("cuda")) == "cuda:0"


# ---------------------------------------------------------------------------------------------- results_dir, clocks
def test_a_results_dir_under_home_is_read_as_the_job_wrote_it(tmp_path, monkeypatch):
    import shutil

    from gac.analysis import load_results
    from gac.results import ResultsStore
    from gac.results.store import results_root
    from tests.analysis.conftest import FIXTURES

    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(FIXTURES / "store_mixed", tmp_path / "res")
    assert ResultsStore("~/res").root == tmp_path / "res" and results_root("~/res") == (tmp_path / "res").resolve()
    assert len(load_results("~/res")) == len(list(ResultsStore(tmp_path / "res").iter_records()))


def test_one_clock_rule_for_every_cpu_timing():
    """Thread CPU time on one torch thread (a sleep is not counted), the wall clock with more (it is)."""
    from gac.evaluation.bench import Protocol
    from gac.evaluation.latency import DEFAULTS, time_calls, timer_for
    from gac.profiling.timing import TimingProtocol, cpu_thread_clock

    def nap():
        return lambda: time.sleep(0.05)

    cpu = torch.device("cpu")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert timer_for(cpu) == "perf_counter" and min(time_calls(nap, cpu, 2)) >= 45
        with cpu_thread_clock():
            assert timer_for(cpu) == "thread_time" and max(time_calls(nap, cpu, 2)) < 20
    finally:
        torch.set_num_threads(threads)
    assert timer_for("cuda") == "cuda_events"
    assert Protocol().resolved("cpu")["timer"] == timer_for("cpu", 1) == "thread_time"  # the bench: one thread
    assert (TimingProtocol.paper().warmup, TimingProtocol.paper().iters, TimingProtocol.paper().trials) == \
        DEFAULTS["kernel"]["cuda"]
    assert (TimingProtocol.quick().warmup, TimingProtocol.quick().iters, TimingProtocol.quick().trials) == \
        DEFAULTS["kernel"]["cpu"]


# ------------------------------------------------------------------------------------------------ width kernels
def test_a_width_targets_kernels_are_measured_and_predicted_alike():
    """The predicted table of a width target is the predictor's own gate, up, gate product and down kernels of a
    layer at that width (gac.predict.predictor.model_kernels), the kernels the measured op times."""
    from gac.align.targets import Target
    from gac.predict import Predictor
    from gac.predict.latency_tables import _KERNELS, predicted_latency_tables
    from gac.predict.predictor import model_kernels
    from gac.profiling.sweeps import _target_op, width_kernels
    from transformers import LlamaConfig

    from gac.compression.structure import Structure

    pred = Predictor("h100")
    hidden, width = 1024, 2816
    st = Structure(LlamaConfig(hidden_size=hidden, intermediate_size=width, num_hidden_layers=1,
                               num_attention_heads=8, num_key_value_heads=8, vocab_size=1000), "float16")
    ks = {k.name: k.ms for k in model_kernels(st, pred.cal, 1, 512) if k.layer == 0}
    mlp = Target("mlp", 1000.0, 1.0, 3 * hidden, d_max=width, kind="width", meta={"hidden_size": hidden},
                 candidates=(width,))
    table = predicted_latency_tables([mlp], [(width,)], pred, batch=1, seq_len=512)
    parts = [v for n, v in ks.items() if n.endswith(("gate_proj", "up_proj", "gate_mul", "down_proj"))]
    assert len(parts) == len(width_kernels(512, hidden, width)) == _KERNELS["width"]
    assert table["mlp"][width] == pytest.approx(sum(parts), rel=1e-9)
    flops = _target_op("width", {"hidden": 64}, 16, 8, 1, 8, None)[2]
    assert flops == 2.0 * 8 * 16 * 64 * 3  # the three GEMMs of width_kernels, the product adds none
