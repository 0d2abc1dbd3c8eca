"""``gac audit MODEL_OR_CHECKPOINT [--json]``: per-layer dimensions and the alignment rules they break.

A gac checkpoint is audited from its weights (the shapes in the safetensors header), not from its editable JSON;
a JSON that disagrees with the weights is reported (exit code 2 after the report). A Hugging Face model directory
is audited once its weights' shapes (safetensors headers, no weight data) are the ones its config.json describes
(:func:`gac.models.checks.check_hf_dir`): else one line, exit 2, and no report of a model that is not on disk."""

from __future__ import annotations

NAME = "audit"
HELP = "report which layer dimensions of a model or gac checkpoint break alignment rules (mod 8/16/32, head_dim)"


DESCRIPTION = """\
Report which layer dimensions of a model or gac checkpoint break alignment rules (mod 8/16/32, head_dim), as the
model is on disk: a gac checkpoint's shapes are read from its weights, a Hugging Face model directory is audited
once its weights' shapes (safetensors headers; no weight data read) are the ones its config.json gives, else one
line and exit 2. A hub id is audited from its config.
"""


def add_arguments(p):
    p.add_argument("model", help="'tiny', a Hugging Face hub id, a local HF model directory, or a gac checkpoint directory")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument("--all", action="store_true", help="list aligned weights too")


def run(args) -> int:
    import json

    from gac.compression.audit import audit, format_audit, mismatch_message
    from gac.errors import GacError
    from gac.models import check_on_disk

    check_on_disk(args.model)  # the model on disk: its weights' shapes, not only its config.json
    rep = audit(args.model)
    print(json.dumps(rep, indent=2) if args.json else format_audit(rep, all_weights=args.all))
    msg = mismatch_message(rep)
    if msg:
        raise GacError(msg)
    return 0
