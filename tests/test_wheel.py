"""gac as a wheel, outside any checkout: build it, install it into a fresh virtual environment, and from a temporary
directory run ``gac demo``, ``gac predict``, one tiny job through the installed ``gac-run``, a researcher's own
config directory on top of the packaged configs, and the command ``gac launch canary`` submits with.

The virtual environment gets the wheel alone (``--no-deps``) and sees the site-packages of the Python that runs the
tests (torch, transformers, ... are not installed again), whatever that Python is: a virtual environment, conda or
a system Python. ``venv --system-site-packages`` would not do: inside a virtual environment it sees the base
interpreter's packages, not the environment's. A ``.pth`` file in the new environment names those directories
instead, as plain paths: their own ``.pth`` files (an editable install of the checkout among them) are not run.
Every command runs without ``PYTHONPATH`` from a directory outside the checkout, so ``import gac`` finds the
installed wheel and nothing else.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_JOB = ["model=tiny", "compressor=llm_pruner", "calibration.n_samples=4", "calibration.seq_len=128",
            "eval=quick", "eval.latency=false", "eval.tasks=[]", "eval.ppl_seq_len=128", "eval.ppl_max_windows=2"]


def _sources(dst: Path) -> None:
    """What a build reads (pyproject.toml, README.md, gac/, conf/, hydra_plugins/), copied so the build leaves the checkout alone."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dst / name)
    shutil.copytree(ROOT / "gac", dst / "gac", ignore=ignore)
    shutil.copytree(ROOT / "conf", dst / "conf", ignore=ignore)
    shutil.copytree(ROOT / "hydra_plugins", dst / "hydra_plugins", ignore=ignore)


def _site_dirs() -> list[str]:
    """Where the running Python's packages are: its site-packages (a virtual environment's, a conda environment's or
    the system's, and the base interpreter's where a virtual environment includes them) and the user's."""
    import site

    dirs = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    dirs += [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir() and Path(d).resolve() != ROOT]


def _run(args, cwd, env, timeout=300):
    r = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, args))}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist, venv, work = (tmp / n for n in ("src", "dist", "venv", "work"))
    for d in (src, dist, work):
        d.mkdir()
    _sources(src)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"  # shared CI cores: no OpenMP oversubscription
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src], tmp, env)
    (wheel,) = dist.glob("gac-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp, env)
    python = venv / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env).strip())
    (purelib / "_gac_test_packages.pth").write_text("".join(f"{d}\n" for d in _site_dirs()))
    # the running Python's pip (seen through the .pth) installs into the venv (sys.prefix): no ensurepip needed
    _run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", wheel], work, env)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {"wheel": wheel, "venv": venv, "work": work, "env": env, "python": python}


def test_wheel_holds_every_module_config_and_data_file(wheel_env):
    names = set(zipfile.ZipFile(wheel_env["wheel"]).namelist())
    modules = {p.relative_to(ROOT).as_posix() for d in ("gac", "hydra_plugins") for p in (ROOT / d).rglob("*.py")}
    configs = {"gac/" + p.relative_to(ROOT).as_posix() for p in (ROOT / "conf").rglob("*.yaml")
               if p.parent.name != "local"}
    data = {p.relative_to(ROOT).as_posix() for p in (ROOT / "gac" / "data").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}
    assert modules - names == set(), "modules missing from the wheel: list their package in pyproject.toml"
    assert configs - names == set()
    assert data - names == set()
    assert "gac/conf/config.yaml" in names and not any(n.startswith("gac/conf/local/") for n in names)


def test_installed_gac_is_the_wheel(wheel_env):
    out = _run([wheel_env["python"], "-c", "import gac, gac.io; print(gac.__file__); print(gac.io.conf_dir())"],
               wheel_env["work"], wheel_env["env"]).split()
    venv = wheel_env["venv"].resolve()
    package, conf = Path(out[0]).resolve(), Path(out[1]).resolve()
    assert package.is_relative_to(venv), f"import gac found {package}, not the wheel in {venv}"
    assert conf == package.parent / "conf", conf


def test_demo_and_predict_run_from_the_wheel(wheel_env):
    w = wheel_env
    demo = _run(["gac", "demo"], w["work"], w["env"])
    assert "gac" in demo
    out = _run(["gac", "predict", "--gpu", "a100", "--model", "llama3_8b"], w["work"], w["env"])
    assert "predicted, A100" in out and "llama3_8b" in out


def test_tiny_job_runs_through_gac_run(wheel_env):
    w = wheel_env
    results, outputs = w["work"] / "results", w["work"] / "outputs"
    out = _run(["gac-run", *TINY_JOB, f"results_dir={results}", f"hydra.run.dir={outputs}"], w["work"], w["env"])
    assert "model=tiny, compressor=llm_pruner" in out and "ppl_tiny" in out
    assert len(list((results / "records").glob("*.json"))) == 1
    assert (outputs / "run.log").is_file()  # the job's log keeps its name whichever entry point ran it


def test_own_config_dir_adds_to_the_packaged_configs(wheel_env):
    w = wheel_env
    mine = w["work"] / "my_conf" / "model"
    mine.mkdir(parents=True)
    (mine / "my_tiny.yaml").write_text("defaults:\n  - tiny\n  - _self_\n\nname: my_tiny\n")
    out = _run(["gac-run", "--config-dir", w["work"] / "my_conf", "model=my_tiny", "--cfg", "job"],
               w["work"], w["env"])
    assert "name: my_tiny" in out and "compressor:" in out  # my model over the packaged groups


def test_the_other_apps_compose_their_packaged_configs(wheel_env):
    w = wheel_env
    out = _run(["gac-bench", "--cfg", "job", "rounds=2"], w["work"], w["env"])
    assert "rounds: 2" in out and "results_dir: results" in out
    out = _run(["gac-profile-device", "--cfg", "job", f"out_dir={w['work'] / 'prof'}", "quick=true"], w["work"], w["env"])
    assert "quick: true" in out and "sweeps:" in out


def test_the_canary_submits_through_the_wheels_app(wheel_env):
    """``gac launch canary`` from a wheel (no experiments/ there): its app check passes and its submit command
    composes the canary's sweep from the packaged configs."""
    w = wheel_env
    code = "import json; from gac.launch import canary; print(json.dumps([canary.check_app(), canary.app_command()]))"
    missing, command = json.loads(_run([w["python"], "-c", code], w["work"], w["env"]))
    assert missing is None and not any("experiments" in a for a in command), command
    out = _run([*command, "experiment=canary", "model=tiny", "--cfg", "hydra"], w["work"], w["env"])
    package = Path(_run([w["python"], "-c", "import gac; print(gac.__file__)"], w["work"], w["env"]).strip()).parent
    assert f"path: {package / 'conf'}" in out and "experiment=canary" in out
