"""The offload folder (``model.offload_dir``): gac writes only files it creates, in a folder of its own, never through
a link, into a pipe or over a user's file; it leaves no weights behind; a folder it cannot use is refused before the
model loads."""

import gc
import os
import shutil
import stat
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from gac.errors import GacError
from gac.models.offload import PREFIX, OffloadFolder, check_offload_dir
from tests.models.memory_maps import mapped_from

SPLIT = {"cpu": "9MiB", "disk": "1GiB"}  # tiny: the embedding and one layer in host memory, the rest on disk


def _placed(folder):
    from gac.models import load_model
    from gac.models.placement import place_model, placement_of

    model, _ = load_model("tiny")
    place_model(model, "cpu", SPLIT, folder)
    return model, [n for n, d in placement_of(model).items() if d == "disk"]


@pytest.mark.timeout(600)  # a unit's weights written into the named pipe would block for ever: fail instead
def test_names_taken_by_a_link_a_users_file_and_a_pipe_are_never_opened(tmp_path):
    off = tmp_path / "off"
    off.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("a file outside the folder")
    (off / "model.layers.3.pt").symlink_to(outside)
    (off / "model.layers.2.pt").write_text("the user's own file")
    os.mkfifo(off / "model.layers.1.pt")
    model, on_disk = _placed(off)
    assert {"model.layers.1", "model.layers.2", "model.layers.3"} <= set(on_disk)
    assert outside.read_text() == "a file outside the folder"
    assert (off / "model.layers.3.pt").is_symlink() and (off / "model.layers.2.pt").read_text() == "the user's own file"
    assert stat.S_ISFIFO((off / "model.layers.1.pt").lstat().st_mode)
    where = mapped_from(model.get_submodule("model.layers.3").mlp.down_proj.weight.data_ptr())
    assert Path(where).parent.parent == off and Path(where).parent.name.startswith(PREFIX)  # gac's own folder
    assert sorted(p.name for p in off.iterdir() if not p.name.startswith(PREFIX)) == [
        "model.layers.1.pt", "model.layers.2.pt", "model.layers.3.pt"]


def test_no_weights_stay_behind_the_model(tmp_path):
    (tmp_path / "notes.txt").write_text("the user's")
    model, on_disk = _placed(tmp_path)
    (own,) = [p for p in tmp_path.iterdir() if p.name.startswith(PREFIX)]
    assert on_disk and not any(own.iterdir())  # each unit's file unlinked once mapped, even while the model lives
    del model
    gc.collect()
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]  # gac's folder went with the model


def _as_unprivileged(call) -> str:
    """The one line ``call()`` raises, run as an unprivileged user (root writes anywhere): in a forked child that
    drops to nobody, when this process is root; "no error" when it raises none."""
    if os.geteuid() != 0:
        try:
            call()
        except GacError as e:
            return str(e)
        return "no error"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, report, and leave without running any of the parent's cleanup
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            try:
                call()
                msg = "no error"
            except GacError as e:
                msg = str(e)
            os.write(w, msg.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


def test_a_folder_gac_cannot_write_is_refused_in_one_line():
    base = Path(tempfile.mkdtemp())
    try:
        base.chmod(0o755)  # reachable by the unprivileged user below
        ro = base / "ro"
        ro.mkdir(mode=0o555)
        ro.chmod(0o555)
        assert "permission denied" in _as_unprivileged(lambda: OffloadFolder(ro))
        assert not any(ro.iterdir())
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_job_refuses_its_offload_folder_before_the_weights_load(make_cfg, tmp_path, monkeypatch):
    """The folder is checked again where the job runs (it may differ from where the config was checked)."""
    from gac.jobs.run import loading
    from gac.jobs.config.build import spec_from_config

    monkeypatch.setattr(loading, "_load_job_model", lambda spec: pytest.fail("the weights were loaded"))
    spec = spec_from_config(make_cfg("compressor=none", "model.device_map=auto", "+model.max_memory.cpu=9MiB",
                                     "+model.max_memory.disk=1GiB", f"model.offload_dir={tmp_path / 'off'}"))
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(GacError, match="a_file, which is a file, so no folder can be made there"):
        loading.load_job_model(replace(spec, offload_dir=str(tmp_path / "a_file" / "off")))
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    (model_dir / "model.safetensors").write_bytes(b"")
    with pytest.raises(GacError, match="is a model directory"):
        loading.load_job_model(replace(spec, offload_dir=str(model_dir)))
    assert sorted(p.name for p in model_dir.iterdir()) == ["config.json", "model.safetensors"]


def test_the_static_check_writes_nothing(tmp_path):
    p = tmp_path / "a" / "b"
    assert check_offload_dir(p) == p and not (tmp_path / "a").exists()
