"""One fast refusal for a hub id the hub cannot serve, in every command that takes one: `gac predict`, `gac audit`
and `gac bench --model` ask the hub once through its client's own session (so the environment's proxy counts) and
refuse in one line, instead of the hub client's half a minute of retries (22 warnings) behind a closed proxy. A
proxy that refuses, on 127.0.0.1; no network. The hub client itself must never be asked."""

from __future__ import annotations

import pytest

from gac.cli import main
from tests.jobs.test_hub_checks import _close_hub_session, _free_port, env  # noqa: F401 - env is a fixture

HUB_ID = "gac-test/no-such-model"


@pytest.fixture
def closed_proxy(env, monkeypatch):  # noqa: F811 - the fixture imported above
    """The hub behind a proxy nothing listens on, and the hub client's config loader armed to fail the test."""
    import transformers

    env.setenv("HF_ENDPOINT", "https://hub.gac-test.invalid")
    env.setenv("HTTPS_PROXY", f"http://127.0.0.1:{_free_port()}")
    _close_hub_session()

    def asked(*a, **k):
        raise AssertionError("the hub client was asked for the model (its retries are what the fast path avoids)")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", asked)
    return env


@pytest.mark.parametrize("argv", [
    ["predict", "--gpu", "a100", "--model", HUB_ID],
    ["audit", HUB_ID],
])
def test_a_hub_id_behind_a_closed_proxy_is_refused_at_once(closed_proxy, argv, capsys):
    assert main(argv) == 2
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert line.startswith(f"gac {argv[0]}: error: '{HUB_ID}' is a Hugging Face hub id, but the hub is not reachable "
                           f"here (hub.gac-test.invalid via proxy http://127.0.0.1:"), line


def test_the_bench_asks_the_same_way(closed_proxy, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text('{"dims": {"model.layers.0.self_attn.q_proj": 64}}')
    assert main(["bench", "--plan", str(plan), "--model", HUB_ID, "--compressor", "asvd"]) == 2
    assert "is a Hugging Face hub id, but the hub is not reachable here" in capsys.readouterr().err


def test_a_cached_model_is_read_without_asking_the_hub(closed_proxy, monkeypatch):
    """The fast path refuses only what is neither cached nor reachable."""
    import gac.hub as hub

    monkeypatch.setattr(hub, "hub_repo_cached", lambda repo, kind="model": True)
    monkeypatch.setattr(hub, "hub_unreachable", lambda *a, **k: pytest.fail("the hub was asked"))
    hub.check_hub_model(HUB_ID)
