"""Evaluation usable from Python without Hydra: perplexity, lm-eval tasks, prefill/decode latency.

>>> from gac.models import load_model
>>> from gac.evaluation import perplexity, evaluate_tasks, prefill_latency, decode_latency
>>> model, tok = load_model("tiny")
>>> perplexity(model, tok, "tiny")["ppl"]                                   # doctest: +SKIP
"""

from gac.evaluation.latency import decode_latency, prefill_latency
from gac.evaluation.perplexity import model_max_length, perplexity, perplexity_of_ids, resolve_seq_len
from gac.evaluation.tasks import TASKS, check_task_names, evaluate_tasks, parse_tasks

__all__ = [
    "TASKS",
    "check_task_names",
    "decode_latency",
    "evaluate_tasks",
    "model_max_length",
    "parse_tasks",
    "perplexity",
    "perplexity_of_ids",
    "prefill_latency",
    "resolve_seq_len",
]
