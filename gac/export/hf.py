"""A model transformers itself can express (dense, or pruned to one MLP width, or one expert width, in every layer) as
a plain Hugging Face folder: ``config.json`` (the width written into the family's own key: ``intermediate_size``,
Qwen3-MoE's ``moe_intermediate_size``, ...), ``model.safetensors``, the tokenizer, and
``gac_export.json`` saying where it came from. ``AutoModelForCausalLM.from_pretrained`` loads it with no gac
installed and no remote code.

:func:`verify_hf` proves that: it loads the folder in a separate Python (``-I``: no user site, no ``PYTHONPATH``, no
current directory) in which importing ``gac`` raises, computes the logits of a token sequence there, and compares
them with the model's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gac.errors import GacError

EXPORT_FILE = "gac_export.json"
#: the folder's files: what transformers saves for a model and its tokenizer, and gac's note
HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
            "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
            "chat_template.jinja", "added_tokens.json", EXPORT_FILE)
HF_TOLERANCE = 1e-5  # the same torch and weights: only the attention kernel's choice may differ

_CHILD = r"""
import importlib.abc, json, sys
class _NoGac(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "gac" or name.startswith("gac."):
            raise ImportError("gac is not importable in this check")
sys.meta_path.insert(0, _NoGac())
import numpy as np, torch
from transformers import AutoModelForCausalLM
folder, ids_file, out_file = sys.argv[1:4]
model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False, dtype=torch.float32).eval()
ids = torch.from_numpy(np.load(ids_file))
with torch.no_grad():
    logits = model(input_ids=ids, use_cache=False).logits.float().numpy()
np.save(out_file, logits)
print(json.dumps({"gac_imported": any(m == "gac" or m.startswith("gac.") for m in sys.modules),
                  "class": type(model).__name__}))
"""


def write_hf(model: nn.Module, tokenizer, config: dict, path: Path, note: dict) -> Path:
    """``path`` (a new directory): ``model``'s weights under ``config``, its tokenizer, and ``note`` as
    :data:`EXPORT_FILE`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    c = dict(config)
    cfg = AutoConfig.for_model(c.pop("model_type"), **c)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(cfg)
    plain.load_state_dict(model.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    path.mkdir(parents=True)
    plain.save_pretrained(str(path))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    (path / EXPORT_FILE).write_text(json.dumps(note, indent=2) + "\n", encoding="utf-8")
    return path


def verify_hf(path: Path, model: nn.Module, timeout_s: float = 600) -> dict:
    """Load ``path`` in a Python where gac cannot be imported and compare its logits with ``model``'s (module
    docstring); a :class:`GacError` when they differ or the folder does not load."""
    from gac.export.onnx import sample_ids

    vocab = int(model.config.get_text_config().vocab_size)
    ids = sample_ids(vocab, (2, 11), seed=4)
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits.float().numpy()
    with tempfile.TemporaryDirectory(prefix="gac-export-hf-") as d:
        np.save(Path(d) / "ids.npy", ids.numpy())
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
        env["HF_HUB_OFFLINE"] = "1"
        try:
            r = subprocess.run([sys.executable, "-I", "-c", _CHILD, str(path), str(Path(d) / "ids.npy"),
                                str(Path(d) / "logits.npy")], capture_output=True, text=True, timeout=timeout_s,
                               cwd=d, env=env)
        except subprocess.TimeoutExpired:
            raise GacError(f"loading the Hugging Face export took over {timeout_s:.0f} s; it was not kept") from None
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise GacError(f"transformers cannot load the Hugging Face export without gac ({last}); it was not kept")
        info = json.loads(r.stdout.strip().splitlines()[-1])
        got = np.load(Path(d) / "logits.npy")
    if info["gac_imported"]:
        raise GacError("loading the Hugging Face export imported gac; it was not kept")
    rel = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)) if got.shape == ref.shape else float("inf")
    if rel > HF_TOLERANCE:
        raise GacError(f"the Hugging Face export's logits differ from the model's by {rel:.2e} of the largest logit; "
                       f"it was not kept")
    return {"engine": "transformers", "class": info["class"], "gac_imported": False, "max_rel_diff": rel}


def check_output_dir(path: Path, force: bool, inputs=()) -> None:
    """Where ``--format hf`` writes: the rule of every model directory gac writes
    (:func:`gac.compression.checkpoint.check_output_dir`), an export being a folder holding :data:`EXPORT_FILE` and
    the Hugging Face files only."""
    from gac.compression.checkpoint import check_output_dir as check_model_dir

    check_model_dir(path, overwrite=force, inputs=inputs, kind="gac export", replaced="a folder gac export wrote",
                    replace_hint="pass --force to replace it", stray=_not_export_files)


def _not_export_files(d: Path) -> list[str] | None:
    """The files of ``d`` an export does not write, or None when ``d`` is no export (no :data:`EXPORT_FILE`)."""
    if not (d / EXPORT_FILE).is_file():
        return None
    return sorted(f.name for f in d.iterdir() if not (f.name in HF_FILES or f.name.startswith("model-")))

