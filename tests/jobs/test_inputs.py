"""What a job reads from the hub, told from the cache files alone (no network here): a fake hub cache and datasets
cache in tmp, `gac fetch` with the downloads faked (they write what the real ones write), and the preflight of an
offline node naming every missing input with the command that fetches them."""

import json
import os

import pytest
from omegaconf import OmegaConf

from gac.cli import main
from gac.errors import GacError
from gac.jobs.run import inputs
from gac.jobs.config.command_line import compose_config
from gac.jobs.config.build import spec_from_config
from gac.jobs.run.inputs import Input, dataset_cached, job_inputs, model_missing

REPO = "meta-llama/Meta-Llama-3-8B"


@pytest.fixture
def hf(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "hf"


def _snapshot(hf, repo=REPO, files=("config.json", "tokenizer.json"), shards=2, present=2):
    """A hub-cache snapshot as huggingface_hub lays it out (files are links into blobs/)."""
    root = hf / "hub" / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / "abc123"
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text("abc123")
    names = [f"model-0000{i + 1}-of-0000{shards}.safetensors" for i in range(shards)]
    index = {"weight_map": {f"w{i}": n for i, n in enumerate(names)}}
    for i, name in enumerate([*files, "model.safetensors.index.json", *names]):
        blob = root / "blobs" / f"b{i}"
        (snap / name).unlink(missing_ok=True)
        if name in names[present:]:
            (snap / name).symlink_to(blob)  # a shard whose blob never finished: a dangling link
            continue
        blob.write_text(json.dumps(index) if name.endswith("index.json") else "x")
        (snap / name).symlink_to(blob)
    return snap


def test_a_model_is_here_only_with_its_config_tokenizer_and_every_shard(hf):
    assert model_missing(REPO) == "not in the hub cache"
    _snapshot(hf, present=1)
    assert model_missing(REPO) == "1 of 2 weight shards (model-00002-of-00002.safetensors...)"
    assert model_missing(REPO, weights=False) is None  # random weights: config and tokenizer are enough
    _snapshot(hf, present=2)
    assert model_missing(REPO) is None
    (hf / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / "abc123" / "tokenizer.json").unlink()
    assert model_missing(REPO) == "its tokenizer (tokenizer.json)"


def test_a_dataset_split_is_here_once_prepared(hf):
    assert not dataset_cached("Salesforce/wikitext", "wikitext-2-raw-v1", "test")
    d = hf / "datasets" / "Salesforce___wikitext" / "wikitext-2-raw-v1" / "0.0.0" / "h"
    d.mkdir(parents=True)
    (d / "wikitext-test.arrow").write_bytes(b"x")
    assert dataset_cached("Salesforce/wikitext", "wikitext-2-raw-v1", "test")
    assert not dataset_cached("Salesforce/wikitext", "wikitext-2-raw-v1", "train")


def _spec(*overrides):
    return spec_from_config(OmegaConf.to_container(compose_config(list(overrides)), resolve=True))


def test_what_each_job_reads():
    assert job_inputs(_spec("model=tiny")) == []  # tiny, its text and its task files ship with gac
    base = job_inputs(_spec("model=llama3_8b", "compressor=none"))
    assert base == [Input("model", REPO), Input("dataset", "Salesforce/wikitext", "wikitext-2-raw-v1", "test"),
                    Input("task", "piqa"), Input("task", "hellaswag")]  # the baseline does not calibrate
    comp = job_inputs(_spec("model=llama3_8b", "compressor=asvd", "eval.tasks=[]", "eval.ppl=false"))
    assert comp == [Input("model", REPO), Input("dataset", "Salesforce/wikitext", "wikitext-2-raw-v1", "train")]
    assert job_inputs(_spec("model=llama3_8b", "model.task_files=tiny", "eval.ppl=false", "compressor=none")) == \
        [Input("model", REPO)]  # piqa/hellaswag from tiny's local files
    assert job_inputs(_spec("model=smollm2", "compressor=none", "eval.ppl=false")) == \
        [Input("fixture", "smollm2"), Input("fixture", "enwiki")]


def test_gac_fetch_check_names_what_is_missing_and_the_command(hf, capsys):
    _snapshot(hf, present=1)
    rc = main(["fetch", "--check", "model=llama3_8b", "compressor=none", "eval.tasks=[]"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "  MISSING     model meta-llama/Meta-Llama-3-8B: 1 of 2 weight shards" in out
    assert "  MISSING     dataset Salesforce/wikitext (wikitext-2-raw-v1, test): not in the datasets cache" in out
    assert out.rstrip().endswith("2 input(s) missing: gac fetch model=llama3_8b compressor=none 'eval.tasks=[]' "
                                 "(where the hub is reachable)")


def test_gac_fetch_downloads_what_is_missing_then_it_is_here(hf, monkeypatch, capsys):
    import datasets
    import huggingface_hub

    calls = []

    def snapshot_download(repo, allow_patterns=None):
        calls.append(("model", repo, tuple(allow_patterns)))
        _snapshot(hf, repo, present=2)

    def load_dataset(name, config=None, **kw):
        calls.append(("dataset", name, config))
        d = hf / "datasets" / name.replace("/", "___") / config / "0.0.0" / "h"
        d.mkdir(parents=True, exist_ok=True)
        for split in ("train", "validation", "test"):
            (d / f"wikitext-{split}.arrow").write_bytes(b"x")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr("gac.hub.hub_unreachable", lambda *a, **k: None)
    monkeypatch.setattr("gac.hub.hub_access_problem", lambda *a, **k: None)
    rc = main(["fetch", "model=llama3_8b", "compressor=none,asvd", "eval.tasks=[]"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert calls[0][:2] == ("model", REPO) and "*.safetensors" in calls[0][2] and "*.bin" not in calls[0][2]
    assert calls[1:] == [("dataset", "Salesforce/wikitext", "wikitext-2-raw-v1")]  # once for both splits
    assert "MISSING" not in out and out.count("  here") == 3
    assert main(["fetch", "--check", "model=llama3_8b", "compressor=none,asvd", "eval.tasks=[]"]) == 0


def test_gac_fetch_where_the_hub_is_not_reachable_says_so(hf, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["fetch", "model=llama3_8b", "compressor=none", "eval.tasks=[]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gac fetch: error: the hub is not reachable here (HF_HUB_OFFLINE is set) and 2 input(s) come from "
                   "it (model meta-llama/Meta-Llama-3-8B, dataset Salesforce/wikitext (wikitext-2-raw-v1, test)); run "
                   "`gac fetch model=llama3_8b compressor=none 'eval.tasks=[]'` where it is (a login node), with the "
                   "caches the jobs use; unset HF_HUB_OFFLINE for it"]


def test_an_offline_job_names_every_missing_input_and_the_fetch_command(hf, monkeypatch):
    from gac.jobs.run.preflight import check_job_here

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    overrides = ["model=llama3_8b", "compressor=asvd", "eval.tasks=[]", "hydra.job.chdir=true"]
    spec = _spec(*overrides[:3])
    with pytest.raises(GacError) as e:
        check_job_here(spec, overrides)
    msg = str(e.value)
    assert msg.startswith("the hub is not reachable here (HF_HUB_OFFLINE is set) and the caches lack what this job "
                          "reads: model meta-llama/Meta-Llama-3-8B: not in the hub cache; dataset Salesforce/wikitext "
                          "(wikitext-2-raw-v1, train): not in the datasets cache; dataset Salesforce/wikitext "
                          "(wikitext-2-raw-v1, test): not in the datasets cache; fetch them where the hub is reachable")
    assert msg.endswith(": gac fetch model=llama3_8b compressor=asvd 'eval.tasks=[]'") and "\n" not in msg
    # everything here: offline is fine (no network is asked: nothing is missing)
    _snapshot(hf, present=2)
    d = hf / "datasets" / "Salesforce___wikitext" / "wikitext-2-raw-v1" / "0.0.0" / "h"
    d.mkdir(parents=True)
    for split in ("train", "test"):
        (d / f"wikitext-{split}.arrow").write_bytes(b"x")
    monkeypatch.setattr("gac.hub.hub_unreachable", lambda *a, **k: pytest.fail("asked the hub"))
    inputs.check_offline(spec, overrides)
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_a_slurm_sweep_with_hf_hub_offline_is_refused_before_submitting_when_the_caches_lack_it(hf, tmp_path):
    """HF_HUB_OFFLINE set at launch goes to every job (hydra.launcher.env): the launch checks the caches now."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    row = "gpu*|h100|gpu:h100:8|1030000|96|2-00:00:00"
    for name, body in (("sbatch", "exit 1"), ("srun", "exit 1"), ("sinfo", f"echo '{row}'")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "PYTHONPATH": str(root), "HF_HOME": str(hf), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, str(root / "experiments" / "run.py"), "-m", "hydra/launcher=slurm_h100",
                        "model=llama3_8b", "gpu=h100", "compressor=none", "eval.tasks=[]", f"results_dir={tmp_path}/r",
                        f"hydra.sweep.dir={tmp_path}/m"], cwd=root, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "experiments/run.py: error: HF_HUB_OFFLINE is set, so the jobs will read only the caches, which lack: model "
        "meta-llama/Meta-Llama-3-8B: not in the hub cache; dataset Salesforce/wikitext (wikitext-2-raw-v1, test): not "
        "in the datasets cache; fetch them first, where the hub is reachable and without HF_HUB_OFFLINE: gac fetch "
        "model=llama3_8b gpu=h100 compressor=none 'eval.tasks=[]'"]
    assert not (tmp_path / "m" / ".submitit").exists()
