"""The Hugging Face hub, as gac meets it: where its caches are and what they hold, whether the hub answers here
(through the proxy the environment names, or not at all offline), the token, and whether that token may read a
repository. Every command and job asks these before it asks the hub for anything, so a closed proxy, a captive
portal or a gated model is one line with its fix, not half a minute of a hub client's retries and a traceback.

What a job reads from the hub (its model, WikiText-2, the lm-eval tasks' data) is :mod:`gac.jobs.run.inputs`'
concern; this module knows the hub, not the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from gac.errors import GacError, short_reason


# ------------------------------------------------------------------------------------------------ home and token
def hf_home() -> Path:
    """Hugging Face's home (its caches and the login token by default): ``HF_HOME``, else ~/.cache/huggingface."""
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser()


def check_hub_token() -> None:
    """The Hugging Face token (``HF_TOKEN``, else the file ``hf auth login`` stored) holds no space or line break
    inside it: such a token cannot go into an HTTP header, and every hub request failed as if the hub could not be
    reached ("couldn't connect"). Spaces at its ends are stripped by the hub client and harmless."""
    token, where = os.environ.get("HF_TOKEN"), "HF_TOKEN"
    fix = "set the token alone on one line, e.g. export HF_TOKEN=hf_... (or run `hf auth login`)"
    if token is None:
        path = Path(os.environ.get("HF_TOKEN_PATH") or hf_home() / "token").expanduser()
        try:
            token, where = path.read_text(errors="replace"), f"the token file {str(path)!r}"
        except OSError:
            return
        fix = "write the token alone on one line there (or run `hf auth login` again), or export HF_TOKEN=hf_..."
    inner = token.strip()
    bad = next((c for c in inner if c.isspace() or not c.isprintable()), None)
    if bad is not None:
        raise GacError(f"{where} holds {bad!r} inside the token (two lines pasted, or a quote lost?), which no hub "
                       f"request can send as it is: {fix}")


def hub_token() -> str | None:
    """The token hub requests send (``HF_TOKEN``, else the one ``hf auth login`` stored), or None (none, or no
    huggingface_hub)."""
    try:
        from huggingface_hub import get_token
    except ImportError:
        return None
    return get_token()


# ------------------------------------------------------------------------------------------------ the caches
def hub_cache_dir() -> Path:
    """Where model weights (and hub datasets' files) are downloaded: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``."""
    return Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("TRANSFORMERS_CACHE") or hf_home() / "hub"
                ).expanduser()


def datasets_cache_dir() -> Path:
    """Where ``datasets`` keeps prepared datasets (WikiText-2, lm-eval's tasks): ``HF_DATASETS_CACHE``, else
    ``$HF_HOME/datasets``."""
    return Path(os.environ.get("HF_DATASETS_CACHE") or hf_home() / "datasets").expanduser()


def snapshots_dir(repo: str, kind: str = "model") -> Path:
    """The folder of the hub repository ``repo``'s snapshots (a model or a dataset) in the hub cache."""
    return hub_repo_dir(repo, kind) / "snapshots"


def hub_repo_dir(repo: str, kind: str = "model") -> Path:
    """The hub cache's folder of the repository ``repo`` (``<kind>s--<org>--<name>``: its snapshots and refs)."""
    return hub_cache_dir() / f"{kind}s--{repo.replace('/', '--')}"


def prepared_dataset_dir(name: str) -> Path:
    """The datasets cache's folder of the hub dataset ``name`` (``<org>___<name>``: its prepared configs)."""
    return datasets_cache_dir() / name.replace("/", "___")


def model_snapshot(repo: str) -> Path | None:
    """The hub cache's snapshot of the model ``repo`` (``HF_HUB_CACHE``): the one ``refs/main`` names, else the last
    one there; None when none is."""
    root = hub_repo_dir(repo, "model")
    snaps = root / "snapshots"
    ref = root / "refs" / "main"
    if ref.is_file():
        cand = snaps / ref.read_text().strip()
        if cand.is_dir():
            return cand
    found = sorted(p for p in snaps.iterdir() if p.is_dir()) if snaps.is_dir() else []
    return found[-1] if found else None


def hub_dataset_cached(path: str) -> bool:
    """Whether the hub dataset ``path`` (``org/name``) is in the local Hugging Face caches (hub or datasets)."""
    return hub_repo_cached(path, "dataset") or prepared_dataset_dir(path).is_dir()


def hub_repo_cached(repo: str, kind: str = "model") -> bool:
    """Whether the hub repository ``repo`` (a model or a dataset) has a snapshot in the local hub cache."""
    return snapshots_dir(repo, kind).is_dir()


# ------------------------------------------------------------------------------------------------ offline
#: the variables that keep the hub clients (huggingface_hub, datasets) off the network
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def offline_set() -> list[str]:
    """Those of :data:`OFFLINE_VARS` set (to 1, true, yes or on) in the environment."""
    return [v for v in OFFLINE_VARS if os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")]


@contextlib.contextmanager
def offline():
    """No hub while local files load: the env vars (for a first import) and the already-imported flags, restored after.

    Without this, ``datasets`` makes a network round trip (a DNS lookup, or a timeout) per local JSON load.
    """
    saved_env = {k: os.environ.get(k) for k in OFFLINE_VARS}
    for k in OFFLINE_VARS:
        os.environ[k] = "1"
    flags = []
    for mod, attr in (("datasets.config", "HF_HUB_OFFLINE"), ("huggingface_hub.constants", "HF_HUB_OFFLINE")):
        m = sys.modules.get(mod)
        if m is not None and hasattr(m, attr):
            flags.append((m, attr, getattr(m, attr)))
            setattr(m, attr, True)
    try:
        yield
    finally:
        for m, attr, old in flags:
            setattr(m, attr, old)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ------------------------------------------------------------------------------------------------ the hub itself
def hub_endpoint() -> str:
    """The Hugging Face hub's address as its clients use it: ``HF_ENDPOINT`` (a mirror), else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``/``HTTP_PROXY``, unless ``NO_PROXY`` exempts its
    host), for messages: the request itself goes through the hub client's session, which reads the same variables."""
    import urllib.request
    from urllib.parse import urlparse

    u = urlparse(url)
    if u.hostname and urllib.request.proxy_bypass_environment(u.hostname):
        return None
    return urllib.request.getproxies_environment().get(u.scheme)


def hub_unreachable(timeout: float = 5.0) -> str | None:
    """Why the Hugging Face hub cannot be reached from here (offline env vars, DNS, a refused connection, a proxy
    that refuses), or None. Asked the way the hub clients ask: one HEAD request through huggingface_hub's own HTTP
    session, so ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` and ``HF_ENDPOINT`` count as they do for a download.
    Raises :class:`GacError` when something else answers in the hub's place (:func:`check_hub_answers`): no
    download can work there, and "not reachable" would name the wrong cause."""
    offline = offline_set()
    if offline:
        return f"{offline[0]} is set"
    from urllib.parse import urlparse

    url = hub_endpoint() + "/"
    proxy = _proxy_for(url)
    where = (urlparse(url).hostname or url) + (f" via proxy {proxy}" if proxy else "")
    try:
        from huggingface_hub import get_session

        session = get_session()  # httpx's (huggingface_hub 1.0 on) or requests': a redirect is looked at, not followed
        stay = {"follow_redirects": False} if hasattr(session, "follow_redirects") else {"allow_redirects": False}
        r = session.head(url, timeout=timeout, **stay)
    except ImportError:
        return "huggingface_hub is not installed"
    except Exception as e:  # noqa: BLE001 - DNS, refused, timeout, proxy errors: each is a reason, not a crash
        return f"{where}: {short_reason(e)}"
    if r.status_code == 407 or r.status_code >= 500:
        return f"{where}: HTTP {r.status_code}" + (" (the proxy asks for credentials)" if r.status_code == 407 else "")
    try:
        r = session.get(url + HUB_PROBE, timeout=timeout, **stay)
    except Exception as e:  # noqa: BLE001 - as above: a reason
        return f"{where}: {short_reason(e)}"
    check_hub_answers(r, url + HUB_PROBE)
    return None


# an API path every hub and hub mirror answers with JSON (the repository's metadata, or a JSON error for one it lacks)
HUB_PROBE = "api/models/openai-community/gpt2/revision/main"


def check_hub_answers(response, url: str) -> None:
    """``response`` (to ``url``, an API path of the hub) is the hub's: JSON, or an error status. A 200 page that is
    not JSON (a captive portal's login page, a proxy's notice, a server that is not a hub behind ``HF_ENDPOINT``) or
    a redirect to another host is one :class:`GacError` naming it and the fix; every hub client would report it as
    "couldn't connect" or a JSON error."""
    from urllib.parse import urlparse

    status = response.status_code
    host = urlparse(url).hostname
    moved = response.headers.get("location") if 300 <= status < 400 else None
    if moved is not None and urlparse(moved).hostname not in (None, host):
        what = f"redirects to {moved[:120]}"
    elif 200 <= status < 300:
        try:
            json.loads(response.content)
            return
        except ValueError:
            kind = (response.headers.get("content-type") or "no content type").split(";")[0]
            head = response.content[:60].decode("utf-8", "replace").strip().replace("\n", " ")
            what = f"answers HTTP {status} with {kind} ({head!r}...), not the hub's JSON"
    else:
        return
    endpoint = hub_endpoint()
    named = (f"HF_ENDPOINT={endpoint} is not a hub or a mirror of it (unset HF_ENDPOINT, or set it to one)"
             if os.environ.get("HF_ENDPOINT") else f"HF_ENDPOINT is unset, so this is {endpoint}")
    proxy = _proxy_for(url)
    raise GacError(f"the Hugging Face hub's address {url} {what}: something else answers in the hub's place, a "
                   f"captive portal (log in to the network first) or a proxy's page"
                   + (f" (HTTPS_PROXY/HTTP_PROXY {proxy})" if proxy else "") + f", or {named}; to use only what "
                   f"is in the local caches, set HF_HUB_OFFLINE=1")


def hub_access_problem(repo: str, kind: str = "model", timeout: float = 10.0) -> str | None:
    """Why this machine's token (``HF_TOKEN``, or the one ``hf auth login`` stored) cannot read the hub
    repository ``repo``, as one sentence with its fix, or None when it can (or the hub's answer is not about
    access: loading then fails or succeeds on its own). Asks the hub's ``auth-check`` endpoint, as
    ``HfApi.auth_check`` does, with a timeout."""
    try:
        from huggingface_hub import get_session
        from huggingface_hub.utils import (
            GatedRepoError,
            HfHubHTTPError,
            RepositoryNotFoundError,
            build_hf_headers,
            hf_raise_for_status,
        )
    except ImportError:
        return None
    token = hub_token()
    page = f"{hub_endpoint()}/{'' if kind == 'model' else kind + 's/'}{repo}"
    login = ("export HF_TOKEN=hf_... (or run `hf auth login`; `huggingface-cli login` before huggingface_hub 1.0) "
             "where the job runs")
    try:
        r = get_session().get(f"{hub_endpoint()}/api/{kind}s/{repo}/auth-check", headers=build_hf_headers(),
                              timeout=timeout)
        hf_raise_for_status(r)
    except GatedRepoError:
        if token is None:
            return (f"{repo!r} is a gated {kind} and no Hugging Face token is set here: accept its license at {page}, "
                    f"then {login}")
        return (f"{repo!r} is a gated {kind} and the token here (HF_TOKEN or `hf auth login`'s) has not been "
                f"granted access: request it at {page}, or use the token of an account that has it")
    except RepositoryNotFoundError:
        if token is None:
            return (f"{repo!r} is not on the Hugging Face hub or is private/gated, and no token is set here: check the "
                    f"id; for a private or gated {kind}, {login}")
        return f"{repo!r} is not on the Hugging Face hub or the token here cannot see it: check the id and HF_TOKEN"
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status == 401:
            return (f"the Hugging Face hub refuses the token here (HTTP 401: invalid or expired) for {repo!r}: renew "
                    f"HF_TOKEN or run `hf auth login`")
        return None
    except Exception:  # noqa: BLE001 - the network: hub_unreachable's concern, not access
        return None
    return None


def check_hub_model(repo: str) -> None:
    """Before anything asks the hub for the model ``repo`` (its config, its weights): in the local cache, or the hub
    answers and this machine's token may read it; else one line at once (a hub client would retry for half a minute
    behind a closed proxy, then fail with a traceback). The one fast path of every command that takes a hub id."""
    if hub_repo_cached(str(repo), "model"):
        return
    why = hub_unreachable()
    if why is not None:
        raise GacError(f"{repo!r} is a Hugging Face hub id, but the hub is not reachable here ({why}) and the model is "
                       f"not in the local cache; download it where the hub is reachable (`hf download {repo} "
                       f"--local-dir DIR`; `huggingface-cli download` before huggingface_hub 1.0) and pass DIR, or use "
                       f"'tiny' (offline)")
    problem = hub_access_problem(str(repo), "model")  # a gated model without a granted token: now, not at load
    if problem is not None:
        raise GacError(problem)
