"""transformers' process-wide patches, as a test may leave them: ``no_init_weights``'s no-op init functions
(``PreTrainedModel.init_weights``, ``torch.nn.init.*``) and torch's default dtype (``from_config`` /
``from_pretrained`` set it while they build). :func:`left_on` names what is still switched; :func:`restore` puts
transformers' and torch's own back, so the tests after a leaking one are unaffected; :func:`after_test` does both
and names the test (the suite's guard in tests/conftest.py)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

NO_OP = "empty_func"  # the name of the no-op no_init_weights swaps in


def _init_module():
    return sys.modules.get("transformers.initialization")


def _torch_init_slots():
    """(module, name) of each torch init function ``no_init_weights`` swaps (``torch.nn.init`` and the modules that
    import its functions by name, e.g. ``torch.nn.modules.activation.xavier_uniform_``)."""
    init = _init_module()
    if init is None:
        return []
    return [(sys.modules[m], name) for m in init.TORCH_MODULES_TO_PATCH if m in sys.modules
            for name in init.TORCH_INIT_FUNCTIONS if hasattr(sys.modules[m], name)]


def _is_no_op(owner, name: str) -> bool:
    return getattr(getattr(owner, name, None), "__name__", "") == NO_OP


def left_on() -> list[str]:
    """What is still switched, e.g. ``["PreTrainedModel.init_weights", "torch.nn.init.normal_"]``; [] when nothing."""
    left = []
    mu = sys.modules.get("transformers.modeling_utils")
    if mu is not None and _is_no_op(mu.PreTrainedModel, "init_weights"):
        left.append("PreTrainedModel.init_weights")
    left += [f"{module.__name__}.{name}" for module, name in _torch_init_slots() if _is_no_op(module, name)]
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_default_dtype() != torch.float32:
        left.append(f"torch's default dtype ({torch.get_default_dtype()})")
    return left


_ORIGINAL: dict = {}  # transformers' own PreTrainedModel.init_weights, kept while it is in place


def remember() -> None:
    """Keep transformers' own ``PreTrainedModel.init_weights`` while it is in place: the no-op replaces the class's
    only reference, so once two interleaved builds leave the no-op on, the original is gone unless kept here."""
    mu = sys.modules.get("transformers.modeling_utils")
    if mu is not None and "init_weights" not in _ORIGINAL and not _is_no_op(mu.PreTrainedModel, "init_weights"):
        _ORIGINAL["init_weights"] = mu.PreTrainedModel.init_weights


class _RememberOnImport(importlib.abc.MetaPathFinder):
    """Runs :func:`remember` as soon as ``transformers.modeling_utils`` is imported (in whichever test imports it
    first: that test may be the one that leaves the no-op on)."""

    def find_spec(self, name, path, target=None):
        if name != "transformers.modeling_utils":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            remember()

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Keep transformers' own ``init_weights`` from the moment it is imported (call once, before the tests run)."""
    remember()
    if not any(isinstance(f, _RememberOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RememberOnImport())


def restore() -> None:
    """Switch back everything :func:`left_on` names (raises when transformers' own ``init_weights`` was never seen:
    :func:`install` was not called before transformers was imported)."""
    mu = sys.modules.get("transformers.modeling_utils")
    if mu is not None and _is_no_op(mu.PreTrainedModel, "init_weights"):
        if "init_weights" not in _ORIGINAL:
            raise AssertionError("transformers' own PreTrainedModel.init_weights was never seen; it cannot be restored")
        mu.PreTrainedModel.init_weights = _ORIGINAL["init_weights"]
    init = _init_module()
    for module, name in _torch_init_slots():
        if _is_no_op(module, name):
            setattr(module, name, init.TORCH_INIT_FUNCTIONS[name])  # torch's own, kept by transformers at its import
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_default_dtype() != torch.float32:
        torch.set_default_dtype(torch.float32)


def after_test(nodeid: str) -> str | None:
    """None when the test ``nodeid`` left nothing switched; else switches it all back and returns the line that
    names the test and what it left."""
    left = left_on()
    if not left:
        remember()
        return None
    restore()
    shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
    return (f"{nodeid} left transformers' process-wide patches on ({shown}): a thread it started still builds a "
            f"model, or two builds ran at once outside gac.transformers_lock; switched back for the tests after it")
