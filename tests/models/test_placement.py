"""A model over several devices (``model.device_map=auto``, :mod:`gac.models.placement`): the planner as a pure
function over unit sizes and fake devices, the memory check over every device, and on the CPU a split across host
memory and disk offload whose compression and perplexity equal the single-device run."""

from __future__ import annotations

import pytest
import torch

from gac.errors import GacError
from gac.models.placement import (
    check_device_map,
    device_capacities,
    parse_max_memory,
    parse_size,
    plan_placement,
)
from tests.models.memory_maps import mapped_from

GIB = 2**30


# ------------------------------------------------------------------------------------------------ sizes and keys
@pytest.mark.parametrize("value,expected", [
    (1024, 1024), ("70GiB", 70 * GIB), ("500MB", 500 * 10**6), ("2.5 TiB", int(2.5 * 2**40)), ("9mib", 9 * 2**20),
    ("123", 123),
])
def test_sizes_parse(value, expected):
    assert parse_size(value) == expected


@pytest.mark.parametrize("value", ["seventy", "70 GiBs", True, "-1GiB", None])
def test_bad_sizes_are_one_line(value):
    with pytest.raises(GacError, match="is not a size; write e.g. 70GiB") as e:
        parse_size(value)
    assert "\n" not in str(e.value)


def test_max_memory_keys_name_devices():
    assert parse_max_memory({0: "1GiB", "cuda:1": "2GiB", "CPU": 5, "disk": "1KiB"}) == {
        "cuda:0": GIB, "cuda:1": 2 * GIB, "cpu": 5, "disk": 1024}
    assert parse_max_memory(None) == {}
    with pytest.raises(GacError, match="unknown device 'gpu0'; use cuda:N"):
        parse_max_memory({"gpu0": "1GiB"})
    with pytest.raises(GacError, match="names cuda:0 twice"):
        parse_max_memory({0: "1GiB", "cuda:0": "1GiB"})
    with pytest.raises(GacError, match="must be one of single, auto"):
        check_device_map("balanced")


# ------------------------------------------------------------------------------------------------ the planner
def _llama70b_units():
    """Llama-3-70B's units in fp16: embedding, 80 decoder layers, final norm, LM head (untied)."""
    h, inter, kv, vocab = 8192, 28672, 1024, 128256
    layer = 2 * (2 * h * h + 2 * kv * h + 3 * h * inter + 2 * h)
    return ([("model.rotary_emb", 256), ("model.embed_tokens", 2 * vocab * h)]
            + [(f"model.layers.{i}", layer) for i in range(80)] + [("model.norm", 2 * h), ("lm_head", 2 * vocab * h)])


def _check_plan(units, caps, plan, follow=None):
    """Every unit on exactly one device; the units in order, the device index never going back (the cuts fall between
    whole units); no device above its capacity."""
    follow = follow or {}
    assert list(plan) == [n for n, _ in units]
    order = list(caps)
    idx = [order.index(plan[n]) for n, _ in units if n not in follow]
    assert idx == sorted(idx), "the devices are filled in order, cut only between units"
    for d, cap in caps.items():
        assert sum(b for n, b in units if plan[n] == d and n not in follow) <= cap, d
    for f, t in follow.items():
        assert plan[f] == plan[t]


def test_llama3_70b_spreads_over_a_node_of_eight_gpus():
    units = _llama70b_units()
    total = sum(b for _, b in units)
    assert 130 * GIB < total < 132 * GIB  # 131 GiB of fp16 weights
    caps = {f"cuda:{i}": int(0.9 * 79.6 * GIB) - 4 * GIB for i in range(8)}
    plan = plan_placement(units, caps)
    _check_plan(units, caps, plan)
    used = list(dict.fromkeys(plan.values()))
    assert used == ["cuda:0", "cuda:1"]  # filled in order: two GPUs hold it, the others stay free
    assert plan["model.embed_tokens"] == "cuda:0" and plan["lm_head"] == "cuda:1"


def test_limits_force_every_gpu_cpu_and_disk_and_no_layer_is_split():
    units = _llama70b_units()
    caps = {**{f"cuda:{i}": 10 * GIB for i in range(8)}, "cpu": 40 * GIB, "disk": 200 * GIB}
    plan = plan_placement(units, caps)
    _check_plan(units, caps, plan)
    assert set(plan.values()) == set(caps)
    # each 10 GiB GPU takes whole layers only: 10 GiB // 1.6 GiB = 6 layers (5 on the first, beside the embedding)
    assert sum(plan[f"model.layers.{i}"] == "cuda:1" for i in range(80)) == 6


def test_a_tied_head_follows_the_embedding():
    units = [("emb", 100), ("l0", 50), ("l1", 50), ("norm", 1), ("head", 0)]
    caps = {"a": 120, "b": 200}
    plan = plan_placement(units, caps, follow={"head": "emb"})
    _check_plan(units, caps, plan, {"head": "emb"})
    assert plan == {"emb": "a", "l0": "b", "l1": "b", "norm": "b", "head": "a"}


def test_a_model_larger_than_all_devices_together_is_refused_in_one_line():
    units = _llama70b_units()
    caps = {"cuda:0": 72 * GIB, "cpu": 40 * GIB}
    with pytest.raises(GacError) as e:
        plan_placement(units, caps)
    msg = str(e.value)
    assert "does not fit all its devices together" in msg and "131 GiB" in msg and "cuda:0 72 GiB, cpu 40 GiB" in msg
    assert "model.max_memory" in msg and "\n" not in msg


def test_room_that_only_a_split_layer_would_use_is_refused():
    units = [("l0", 60), ("l1", 60), ("l2", 60)]
    caps = {"a": 100, "b": 100}  # 200 >= 180 in all, but no device holds two layers
    with pytest.raises(GacError, match=r"does not fit its devices at layer boundaries: l2 .* a layer is never split"):
        plan_placement(units, caps)
    assert plan_placement(units, {"a": 120, "b": 60}) == {"l0": "a", "l1": "a", "l2": "b"}


def test_each_device_keeps_free_only_what_its_own_units_need():
    """A unit's working set (``extra``) counts on the device that runs it, only where gac sizes the device from its
    free memory (``extra_on``); a tied head's goes with the embedding it follows."""
    from gac.models.placement import device_needs

    units = [("emb", 10), ("l0", 10), ("l1", 10), ("l2", 10), ("l3", 10), ("head", 10)]
    extra = {"l0": 5, "l1": 5, "l2": 5, "l3": 5, "head": 20}
    caps = {"a": 50, "b": 60}
    plan = plan_placement(units, caps, extra=extra)
    assert plan == {"emb": "a", "l0": "a", "l1": "a", "l2": "b", "l3": "b", "head": "b"}
    assert device_needs(units, plan, extra) == {"a": 40, "b": 60}  # not the 40 of working set on each device
    whole = sum(extra.values())
    with pytest.raises(GacError, match="does not fit all its devices together"):  # the whole set on every device
        plan_placement(units, {d: c - whole for d, c in caps.items()})
    assert plan_placement(units, {"a": 50, "b": 30}, extra=extra, extra_on={"a"})["head"] == "b"  # b: weights only
    with pytest.raises(GacError, match=r"at layer boundaries: head \(.* of working set beside it\)"):
        plan_placement(units, {"a": 50, "b": 55}, extra=extra)  # 105 in all, but the head's logits find no room
    tied = [("emb", 10), ("l0", 10), ("head", 0)]
    assert plan_placement(tied, {"a": 25, "b": 100}, {"head": "emb"}, extra={"head": 20}) == {
        "emb": "b", "l0": "b", "head": "b"}  # the logits are made where the tied head (the embedding) is


def test_a_spread_model_plans_its_working_set_layer_by_layer(monkeypatch):
    """plan_for_config on tiny's config over two fake 20 MiB GPUs: each decoder layer brings its share, the tied
    head's logits go with the embedding; the whole working set kept free on every GPU would not fit."""
    from gac.fixtures import named_config
    from gac.models.placement import WorkingSet, plan_for_config

    MiB = 2**20
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    config = named_config("tiny")
    free = {"cuda:0": int(17 * MiB / 0.9), "cuda:1": int(17 * MiB / 0.9)}.get  # 17 MiB for weights each
    ws = WorkingSet(per_device=0, per_layer=3 * MiB, at_head=1 * MiB)  # tiny fp32: 4 MiB embedding, 2.77 MiB layers
    plan = plan_for_config(config, "float32", "cuda", None, reserve=ws, available=free)
    assert [plan[f"model.layers.{i}"] for i in range(4)] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    assert plan["model.embed_tokens"] == plan["lm_head"] == "cuda:0"
    whole = ws.per_device + 4 * ws.per_layer + ws.at_head
    with pytest.raises(GacError, match="does not fit all its devices together"):
        plan_for_config(config, "float32", "cuda", None, reserve=whole, available=free)


def test_device_capacities_over_fake_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    free = {"cuda:0": 80 * GIB, "cuda:1": 80 * GIB, "cuda:2": 40 * GIB, "cuda:3": 80 * GIB, "cpu": 500 * GIB}
    caps = device_capacities("cuda:2", {"cuda:3": "10GiB", "cpu": "100GiB"}, reserve=4 * GIB, available=free.get)
    assert list(caps) == ["cuda:2", "cuda:0", "cuda:1", "cuda:3", "cpu"]  # the job's GPU first, then the others
    assert caps["cuda:2"] == int(0.9 * 40 * GIB) - 4 * GIB and caps["cuda:3"] == 10 * GIB and caps["cpu"] == 100 * GIB
    with pytest.raises(GacError, match="names cuda:7 but this node has 4 GPU"):
        device_capacities("cuda", {"cuda:7": "1GiB"}, available=free.get)
    with pytest.raises(GacError, match="names cuda:0 but the job runs on cpu"):
        device_capacities("cpu", {"cuda:0": "1GiB"}, available=free.get)
    assert device_capacities("cpu", {"disk": "1GiB"}, reserve=GIB, available=free.get) == {
        "cpu": 499 * GIB, "disk": GIB}


# ------------------------------------------------------------------------------------------------ the memory check
def _fake_node(monkeypatch, gpus: int, gib: float = 79.6, host_gib: float = 1000.0):
    import gac.compression.resources as resources

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)

    def device_memory(device="cpu"):
        if str(device).startswith("cuda"):
            return {"device": str(device), "total_mb": gib * 1024, "available_mb": gib * 1024}
        return {"device": "cpu", "total_mb": host_gib * 1024, "available_mb": host_gib * 1024}

    monkeypatch.setattr(resources, "device_memory", device_memory)


def test_llama3_70b_is_checked_against_every_gpu_of_the_node(make_cfg, monkeypatch):
    from gac.jobs.config.build import spec_from_config
    from gac.jobs.run.memory_fits import check_job_fits

    _fake_node(monkeypatch, 8)
    args = ("model=llama3_70b", "gpu=h100", "compressor=asvd", "allocation=proportional")
    single = spec_from_config(make_cfg(*args))
    with pytest.raises(GacError, match="one GPU"):
        check_job_fits(single)
    spread = spec_from_config(make_cfg(*args, "model.device_map=auto"))
    fp = check_job_fits(spread)
    assert fp is not None and 130 * GIB < fp.weights < 132 * GIB
    _fake_node(monkeypatch, 1)  # one GPU and no CPU memory allowed: refused before loading, in one line
    with pytest.raises(GacError) as e:
        check_job_fits(spread)
    assert "does not fit all its devices together" in str(e.value) and "\n" not in str(e.value)
    allowed = spec_from_config(make_cfg(*args, "model.device_map=auto", "+model.max_memory.cpu=200GiB"))
    assert check_job_fits(allowed) is not None  # CPU memory named: counted with the GPU
    _fake_node(monkeypatch, 8, host_gib=64)  # read on the host first: a host smaller than the weights is refused
    with pytest.raises(GacError, match="read on the host before it is spread"):
        check_job_fits(spread)


@pytest.mark.parametrize("compressor", ["llm_pruner", "palu", "asvd"])
def test_llama3_70b_fits_a_node_of_eight_80gb_gpus_each_keeping_its_share(monkeypatch, tmp_path, compressor):
    """The documented example (docs/slurm-and-wandb.md) with the job's own calibration (32 x 2048 tokens): every GPU
    keeps free what its own layers need (LLM-Pruner's element-wise gradient sums alone take ~184 GiB, far more than
    one GPU), and the plan leaves each GPU within its memory."""
    from omegaconf import OmegaConf

    from gac.jobs.config.command_line import compose_config
    from gac.jobs.config.build import spec_from_config
    from gac.jobs.run.memory_fits import check_job_fits, job_model_config
    from gac.models.placement import (
        device_needs,
        placement_units,
        plan_for_config,
        unit_working_set,
        working_set,
    )

    _fake_node(monkeypatch, 8)
    cfg = OmegaConf.to_container(compose_config(["model=llama3_70b", "gpu=h100", f"compressor={compressor}",
                                                 "model.device_map=auto", f"results_dir={tmp_path}"]), resolve=True)
    spec = spec_from_config(cfg)
    fp = check_job_fits(spec)
    assert fp is not None and fp.params > 70e9
    ws = working_set(fp)
    whole = fp.device_bytes - fp.weights
    assert ws.per_device + 80 * ws.per_layer + ws.at_head >= whole  # the shares cover the one-device estimate
    gpu = int(0.9 * 79.6 * GIB)
    if compressor != "asvd":  # a gradient pass: the whole working set would leave no GPU any room
        assert whole > gpu
    config = job_model_config(spec)
    plan = plan_for_config(config, fp.dtype, "cuda", None, reserve=ws, available=lambda d: int(79.6 * GIB))
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    units, follow = placement_units(skeleton)
    needs = device_needs(units, plan, unit_working_set(skeleton, units, ws), follow)
    assert set(needs) <= {f"cuda:{i}" for i in range(8)} and len(needs) >= 2
    for d, need in needs.items():
        assert ws.per_device + need <= gpu, (d, need / GIB)
        assert need - sum(b for n, b in units if plan[n] == d and n not in follow) < whole  # a share, not the whole


def test_the_placement_keys_are_checked_and_leave_the_default_record_key_alone(make_cfg, tmp_path):
    from gac.jobs.config.build import spec_from_config

    spec = spec_from_config(make_cfg("compressor=asvd"))
    assert spec.device_map == "single" and spec.max_memory is None
    assert not {"device_map", "max_memory", "offload_dir"} & set(spec.identity())
    auto = spec_from_config(make_cfg("compressor=asvd", "model.device_map=auto", "+model.max_memory.cpu=1GiB",
                                     f"model.offload_dir={tmp_path / 'offload'}"))
    assert auto.identity()["device_map"] == "auto" and "offload_dir" not in auto.identity() and auto.key != spec.key
    with pytest.raises(GacError, match="model.device_map must be one of single, auto"):
        spec_from_config(make_cfg("model.device_map=sequential"))
    with pytest.raises(GacError, match="model.max_memory applies to a model spread over devices"):
        spec_from_config(make_cfg("+model.max_memory.cpu=1GiB"))
    with pytest.raises(GacError, match="model.max_memory.cpu: 'lots' is not a size"):
        spec_from_config(make_cfg("model.device_map=auto", "+model.max_memory.cpu=lots"))


# ------------------------------------------------------------------------------------------------ a real split on CPU
SPLIT = {"cpu": "9MiB", "disk": "1GiB"}  # tiny: the embedding and one layer in host memory, the rest on disk


@pytest.fixture(scope="module")
def tiny_data():
    from gac.models import load_model
    from gac.text import calibration_batches

    _, tok = load_model("tiny")
    return tok, calibration_batches(tok, "tiny", 4, 64, seed=0, split="train")


def _tiny(split: bool, tmp_path):
    from gac.models import load_model
    from gac.models.placement import place_model

    model, _ = load_model("tiny")
    if split:
        place_model(model, "cpu", SPLIT, tmp_path / "offload")
    return model


def test_tiny_split_over_host_memory_and_disk(tmp_path, tiny_data):
    from gac.evaluation import perplexity
    from gac.models.placement import placement_of, spans_devices

    tok, _ = tiny_data
    ref = perplexity(_tiny(False, tmp_path), tok, "tiny", max_windows=4)["ppl"]
    model = _tiny(True, tmp_path)
    plan = placement_of(model)
    assert spans_devices(model) and {"cpu", "disk"} == set(plan.values())
    assert plan["model.embed_tokens"] == "cpu" and plan["lm_head"] == "cpu"  # the tied head follows the embedding
    on_disk = [n for n, d in plan.items() if d == "disk"]
    assert "model.layers.3" in on_disk
    (own,) = (tmp_path / "offload").iterdir()  # gac's own folder; each unit's file unlinked once mapped
    assert own.name.startswith("gac-offload-") and not any(own.iterdir())
    w = model.get_submodule("model.layers.3").mlp.down_proj.weight
    assert mapped_from(w.data_ptr()) == str(own / "model.layers.3.pt")  # the file, not host memory
    assert perplexity(model, tok, "tiny", max_windows=4)["ppl"] == ref


@pytest.mark.parametrize("compressor,allocation", [("llm_pruner", None), ("asvd", "proportional")])
def test_compressing_a_split_model_equals_the_single_device_run(tmp_path, tiny_data, compressor, allocation):
    from gac.compression.compress import compress_model
    from gac.evaluation import perplexity
    from gac.models.placement import placement_of

    tok, calib = tiny_data
    out = []
    for split in (False, True):
        model = _tiny(split, tmp_path / str(split))
        model, plan, _ = compress_model(model, tok, compressor, ratio=0.3, calib_ids=calib, allocation=allocation)
        if split:
            for name, dev in placement_of(model).items():  # compressed modules replaced originals on the same device
                assert {p.device.type for p in model.get_submodule(name).parameters()} <= {"cpu"}, (name, dev)
        out.append((dict(plan.dims), perplexity(model, tok, "tiny", max_windows=4)["ppl"]))
    assert out[0][0] == out[1][0]
    assert out[0][1] == out[1][1]


def test_a_job_on_a_split_model_records_quality_and_a_note_instead_of_latency(make_cfg, tmp_path):
    from gac.jobs.run.recipe import run_config

    base = ("compressor=llm_pruner", "ratio=0.3", "eval.tasks=[]", "eval.ppl_max_windows=4")
    single = run_config(make_cfg(*base, results_dir=tmp_path / "r"))
    spread = run_config(make_cfg(*base, "model.device_map=auto", "+model.max_memory.cpu=9MiB",
                                 "+model.max_memory.disk=1GiB", f"model.offload_dir={tmp_path / 'off'}",
                                 results_dir=tmp_path / "r"))
    assert spread["key"] != single["key"]
    assert spread["plan"]["dims"] == single["plan"]["dims"]
    assert spread["metrics"] == {k: v for k, v in single["metrics"].items() if not k.startswith("prefill")}
    note = spread["evaluation"]["latency"]["skipped"]
    assert "latency not measured" in note and "cpu, disk" in note and "single-GPU measurement" in note
    assert set(spread["memory"]["placement"]) == {"cpu", "disk"}
    assert "placement" not in single["memory"] and "prefill_ms" in single["metrics"]
