"""Something that is not the Hugging Face hub answering in its place (a captive portal's page, a proxy's notice, an
``HF_ENDPOINT`` that is no hub) and a token with a line break: each its own one line with its fix, in every command
that talks to the hub, never "couldn't connect". The hub is a local ``http.server`` (no network), stopped and its
thread joined before each test ends."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from gac.errors import GacError

PORTAL = b"<html><body>Welcome to the hotel wifi, please log in</body></html>"


class _Answer(http.server.BaseHTTPRequestHandler):
    body, kind, status, location = PORTAL, "text/html", 200, None

    def _answer(self):
        self.send_response(self.status)
        self.send_header("Content-Type", self.kind)
        self.send_header("Content-Length", str(len(self.body)))
        if self.location:
            self.send_header("Location", self.location)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(self.body)

    do_GET = do_HEAD = _answer

    def log_message(self, *args):  # the test's output, not the server's
        pass


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """Start a local server answering every request as ``answer(**kw)`` says, as HF_ENDPOINT, with empty caches."""
    servers = []

    def start(**kw):
        handler = type("Handler", (_Answer,), kw)
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        servers.append((srv, t))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{srv.server_port}")
        return f"http://127.0.0.1:{srv.server_port}"

    for var in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy",
                "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN", "HF_HUB_CACHE", "HF_DATASETS_CACHE",
                "TRANSFORMERS_CACHE", "HF_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    # the offline flags are read once, at import: the conftest's HF_HUB_OFFLINE=1 holds them if an earlier test
    # imported huggingface_hub / datasets, whatever this test's environment says
    import datasets.config
    import huggingface_hub.constants
    from huggingface_hub import close_session

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    close_session()  # the hub client's session reads the proxy variables when it is made
    yield start
    close_session()
    for srv, t in servers:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=10)
        assert not t.is_alive()


def _portal_line(err: str) -> None:
    assert "not the hub's JSON" in err and "captive portal" in err and "HF_ENDPOINT=http://127.0.0.1:" in err
    assert "HF_HUB_OFFLINE=1" in err and "couldn't connect" not in err and "not reachable" not in err


def test_a_page_in_the_hubs_place_is_named_with_its_fix(hub):
    from gac.hub import hub_unreachable

    hub()
    with pytest.raises(GacError) as e:
        hub_unreachable()
    _portal_line(str(e.value))


def test_a_redirect_to_another_host_is_named(hub):
    from gac.hub import hub_unreachable

    hub(status=302, location="http://portal.example/login", body=b"")
    with pytest.raises(GacError, match=r"redirects to http://portal.example/login: something else answers"):
        hub_unreachable()


@pytest.mark.parametrize("status,body", [(200, {"id": "openai-community/gpt2", "sha": "a" * 40}),
                                         (404, {"error": "Repository not found"}),
                                         (401, {"error": "Invalid credentials"})])
def test_the_hubs_own_json_answers_are_the_hub(hub, status, body):
    from gac.hub import hub_unreachable

    hub(status=status, body=json.dumps(body).encode(), kind="application/json")
    assert hub_unreachable() is None


@pytest.mark.parametrize("argv", [
    ["fetch", "model=llama3_8b", "compressor=none", "eval=none"],  # the model's download
    ["compress", "meta-llama/Meta-Llama-3-8B", "--compressor", "asvd", "--ratio", "0.2", "-o", "{tmp}/out"],
    ["audit", "meta-llama/Meta-Llama-3-8B"],
    ["evaluate", "tiny", "--ppl", "--ppl-data", "wikitext2"],  # WikiText-2 from the hub
])
def test_every_command_that_asks_the_hub_names_the_page(hub, argv, tmp_path, capsys):
    from gac.cli import main

    hub()
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    _portal_line(err)
    assert not (tmp_path / "out").exists()


def test_a_job_the_tasks_and_the_doctor_name_the_page(hub, tmp_path):
    from gac.evaluation.tasks import check_hub_tasks
    from gac.jobs.doctor.node import check_hub
    from gac.jobs.doctor.check import guard
    from gac.jobs.run.inputs import check_offline
    from gac.jobs.sweep.points import sweep_points

    hub()
    spec = sweep_points(["model=llama3_8b", "compressor=none", "eval=none", f"results_dir={tmp_path}/r"])[0]["spec"]
    with pytest.raises(GacError) as e:
        check_offline(spec)
    _portal_line(str(e.value))
    with pytest.raises(GacError) as e:  # what `gac evaluate --tasks arc_easy` and a job's tasks ask first
        check_hub_tasks(["arc_easy"])
    _portal_line(str(e.value))
    c = guard("hub", check_hub)
    assert c.status == "FAIL"
    _portal_line(c.detail)


@pytest.mark.parametrize("token,where", [("hf_abc\nhf_def", "env"), ("hf_abc\nhf_def\n", "file")])
def test_a_token_with_a_line_break_is_named_before_any_request(hub, monkeypatch, tmp_path, token, where):
    from gac.hub import check_hub_token, hf_home

    if where == "env":
        monkeypatch.setenv("HF_TOKEN", token)
        fix, named = "export HF_TOKEN=hf_...", "HF_TOKEN holds '\\n'"
    else:
        hf_home().mkdir(parents=True)
        (hf_home() / "token").write_text(token)  # where `hf auth login` writes it
        fix, named = "write the token alone on one line there", f"the token file '{hf_home() / 'token'}' holds '\\n'"
    with pytest.raises(GacError) as e:
        check_hub_token()
    assert named in str(e.value) and fix in str(e.value)
    monkeypatch.setenv("HF_TOKEN", " hf_abc\n")  # at its ends: stripped by the hub client, harmless
    check_hub_token()
