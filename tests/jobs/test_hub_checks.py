"""The hub checks before a job: reachability asked through the hub client's own session (so a proxy from the
environment counts), and a gated model's access checked for this machine's token. A local proxy and a local fake
hub on 127.0.0.1; no network."""

from __future__ import annotations

import http.server
import threading

import pytest

from gac.errors import GacError
from gac.hub import HUB_PROBE, hub_access_problem, hub_unreachable
from gac.jobs.run.preflight import check_model_here

PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "all_proxy",
              "no_proxy", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def _close_hub_session():
    from huggingface_hub import close_session

    close_session()  # the hub client's session reads the proxy variables when it is made


@pytest.fixture
def env(monkeypatch, tmp_path):
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    import huggingface_hub.constants

    # read once, when huggingface_hub is imported: another test module's conftest may have set HF_HUB_OFFLINE then
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    _close_hub_session()
    yield monkeypatch
    _close_hub_session()


def _serve(handler_cls):
    """A local HTTP server on a free port, serving from a thread until :func:`_stop`."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
    server.thread = threading.Thread(target=server.serve_forever, daemon=True)
    server.thread.start()
    return server


def _stop(server) -> None:
    """Stop ``server`` and join its thread (and its request threads): none outlives the test."""
    server.shutdown()
    server.server_close()
    server.thread.join()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def proxy():
    """A forward proxy that records each request line and answers itself: 200 to a plain request (a GET with the
    JSON object ``{}``, as the hub's API answers), 200 to a CONNECT (then closes: no tunnel), or the status in
    ``status``."""
    seen: list[str] = []
    state = {"status": 200}

    class Proxy(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _answer(self):
            seen.append(self.requestline)
            body = b"{}" if self.command == "GET" else b""
            self.send_response(state["status"])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_HEAD = _answer

        def do_CONNECT(self):
            seen.append(self.requestline)
            self.send_response(200)
            self.end_headers()
            self.close_connection = True

    server = _serve(Proxy)
    server.seen, server.state = seen, state
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield server
    _stop(server)


def test_the_hub_is_asked_through_the_environments_proxy(env, proxy):
    direct = f"http://127.0.0.1:{_free_port()}"  # nothing listens here: only the proxy can answer
    env.setenv("HF_ENDPOINT", direct)
    env.setenv("HTTP_PROXY", proxy.url)
    assert hub_unreachable(timeout=5) is None
    assert proxy.seen == [f"HEAD {direct}/ HTTP/1.1", f"GET {direct}/{HUB_PROBE} HTTP/1.1"]  # then its API's JSON


def test_no_proxy_goes_direct_and_the_reason_says_where(env, proxy):
    direct = f"http://127.0.0.1:{_free_port()}"
    env.setenv("HF_ENDPOINT", direct)
    env.setenv("HTTP_PROXY", proxy.url)
    env.setenv("NO_PROXY", "127.0.0.1")
    why = hub_unreachable(timeout=5)
    assert why is not None and why.startswith("127.0.0.1: ") and "via proxy" not in why
    assert proxy.seen == []


def test_https_goes_through_a_connect_and_a_refusing_proxy_is_a_reason(env, proxy):
    env.setenv("HF_ENDPOINT", "https://hub.gac-test.invalid")  # no such host: only the proxy could reach it
    env.setenv("HTTPS_PROXY", proxy.url)
    why = hub_unreachable(timeout=5)  # the proxy opens no tunnel: TLS fails, through the proxy
    assert proxy.seen and proxy.seen[0].startswith("CONNECT hub.gac-test.invalid:443 ")
    assert why is not None and why.startswith(f"hub.gac-test.invalid via proxy {proxy.url}: ")
    proxy.state["status"] = 407
    env.setenv("HF_ENDPOINT", "http://hub.gac-test.invalid")
    env.setenv("HTTP_PROXY", proxy.url)
    _close_hub_session()
    assert hub_unreachable(timeout=5) == (f"hub.gac-test.invalid via proxy {proxy.url}: HTTP 407 (the proxy asks "
                                          f"for credentials)")


def test_offline_variables_answer_without_a_request(env, proxy):
    env.setenv("HTTP_PROXY", proxy.url)
    env.setenv("HF_HUB_OFFLINE", "1")
    assert hub_unreachable() == "HF_HUB_OFFLINE is set"
    assert proxy.seen == []


GATED = "meta-llama/Meta-Llama-3-8B"


@pytest.fixture
def fake_hub(env, tmp_path):
    """A hub on 127.0.0.1 that answers auth-check as huggingface.co does: a gated repo is 401 GatedRepo without a
    token and 403 GatedRepo with one not granted; an unknown repo 404 RepoNotFound; an open one 200."""
    calls: list[tuple[str, bool]] = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, status, code=None):
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", "Access to this model is restricted.")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_HEAD(self):
            self._send(200)

        def do_GET(self):
            auth = self.headers.get("authorization") is not None
            calls.append((self.path, auth))
            if self.path == f"/api/models/{GATED}/auth-check":
                self._send(403 if auth else 401, "GatedRepo")
            elif self.path == "/api/models/openai-community/gpt2/auth-check":
                self._send(200)
            else:
                self._send(401 if not auth else 404, "RepoNotFound")

    server = _serve(Hub)
    env.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    from huggingface_hub import constants

    env.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))  # no stored login token either
    server.calls = calls
    yield server
    _stop(server)


def test_a_gated_model_without_a_token_is_refused_naming_the_fix(fake_hub):
    with pytest.raises(GacError) as e:
        check_model_here(GATED)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{GATED!r} is a gated model and no Hugging Face token is set here")
    assert "HF_TOKEN" in msg and "`hf auth login`" in msg and "`huggingface-cli login` before huggingface_hub 1.0" in msg and f"/{GATED}" in msg
    assert fake_hub.calls == [(f"/{HUB_PROBE}", False), (f"/api/models/{GATED}/auth-check", False)]  # is it the hub


def test_a_token_not_granted_is_refused_and_the_token_is_sent(fake_hub, env):
    env.setenv("HF_TOKEN", "hf_notgranted")
    with pytest.raises(GacError, match="has not been granted access: request it at"):
        check_model_here(GATED)
    assert fake_hub.calls == [(f"/{HUB_PROBE}", False), (f"/api/models/{GATED}/auth-check", True)]  # no token sent first


def test_open_and_unknown_repos(fake_hub):
    check_model_here("openai-community/gpt2")
    assert "is not on the Hugging Face hub or is private/gated" in hub_access_problem("org/nope")


def test_an_unreachable_hub_names_the_download_command_of_this_huggingface_hub(env):
    env.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(GacError) as e:
        check_model_here("org/not-cached")
    msg = str(e.value)
    assert "\n" not in msg and "HF_HUB_OFFLINE is set" in msg
    assert "`hf download org/not-cached --local-dir DIR`" in msg  # huggingface_hub >= 1.0 has only `hf`
