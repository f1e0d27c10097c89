"""Who may do what on `feedproc serve`, through real HTTP: tokens of each scope on a route of each
group, reads closed beyond loopback, Basic for reads only, rotation, worker tokens limited to
queues, the Host check, and the token checked before the body is read. What depends on how
`serve` was started is tested on real `feedproc serve` processes."""

from __future__ import annotations

import base64
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from feedproc import Feed
from feedproc.auth import Access, load_tokens

from ..api_support import AUTH, TOKEN, ApiServer, ServeProcess
from ..support import run_cli
from .test_api import error_of

READ = "read-token-0123456789"
OPERATE = "operate-token-0123456789"
ADMIN = "admin-token-0123456789"
WORKER = "worker-token-0123456789"
GPU = "gpu-only-token-0123456789"
SCOPED = {
    "FEEDPROC_READ_TOKENS": READ,
    "FEEDPROC_OPERATE_TOKENS": OPERATE,
    "FEEDPROC_ADMIN_TOKENS": ADMIN,
    "FEEDPROC_WORKER_TOKENS": f"{WORKER},gpu:{GPU}",
    "FEEDPROC_API_TOKEN": TOKEN,
}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def basic(token: str, user: str = "me") -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()}


@pytest.fixture
def closed(db_url: str) -> Iterator[ApiServer]:
    """A server whose reads need a token (as beyond loopback), with a token of every scope; queues
    gpu and hr in pull mode, one item in each."""
    feed = Feed(db_url)
    for queue in ("gpu", "hr"):
        feed.set_queue(queue, mode="pull")
        feed.add_partition(f"{queue}-job", [(0, b'{"salary": 1}')], queue=queue)
    feed.close()
    server = ApiServer(db_url, access=Access(load_tokens(SCOPED), open_reads=False))
    yield server
    server.close()


# ---------------------------------------------------------------- scopes

#: A representative call of each group: (method, path, body).
CALLS = {
    "read": ("GET", "/api/v1/partitions", None),
    "dashboard": ("GET", "/", None),
    "metrics": ("GET", "/metrics", None),
    "operate": ("POST", "/api/v1/queues/gpu/pause", None),
    "admin": ("PUT", "/api/v1/queues/gpu", {"limit": 5}),
    "worker": ("POST", "/api/v1/queues/gpu/claim", {"worker": "w", "max": 1}),
}
ALLOWED = {
    READ: {"read", "dashboard", "metrics"},
    OPERATE: {"read", "dashboard", "metrics", "operate"},
    ADMIN: {"read", "dashboard", "metrics", "operate", "admin"},
    WORKER: {"worker"},
}


@pytest.mark.sqlite_only
@pytest.mark.parametrize("token", list(ALLOWED), ids=["read", "operate", "admin", "worker"])
def test_each_scope_may_make_its_calls_and_no_others(closed: ApiServer, token: str) -> None:
    for name, (method, path, body) in CALLS.items():
        response = closed.client.request(method, path, json=body, headers=bearer(token))
        if name in ALLOWED[token]:
            assert response.status_code == 200, (name, response.text)
        else:
            assert "needs the" in error_of(response, 403), name


@pytest.mark.sqlite_only
def test_without_a_token_every_call_but_health_is_401(closed: ApiServer) -> None:
    for name, (method, path, body) in CALLS.items():
        response = closed.client.request(method, path, json=body)
        assert "missing or wrong bearer token" in error_of(response, 401), name
    wrong = closed.client.get("/api/v1/items/1", headers=bearer("not-a-token-0123456789"))
    assert error_of(wrong, 401)
    assert closed.get("/healthz").status_code == 200
    assert closed.get("/static/dashboard.js").status_code == 200


@pytest.mark.sqlite_only
def test_the_dashboard_asks_a_browser_for_basic_credentials_and_takes_a_read_token(closed: ApiServer) -> None:
    refused = closed.get("/")
    assert refused.status_code == 401
    assert 'Basic realm="feedproc"' in refused.headers.get_list("www-authenticate")[0]
    assert closed.get("/", headers=basic(READ)).status_code == 200
    assert closed.get("/api/v1/items/1", headers=basic(READ, user="")).json()["partition"] == "gpu-job"
    assert closed.get("/", headers=basic(WORKER)).status_code == 403
    assert closed.get("/", headers=basic("not-a-token-0123456789")).status_code == 401


@pytest.mark.sqlite_only
def test_basic_credentials_never_change_anything(closed: ApiServer) -> None:
    for token in (OPERATE, ADMIN, TOKEN):
        response = closed.client.post("/api/v1/queues/gpu/pause", headers=basic(token))
        assert "bearer token" in error_of(response, 401)
        assert response.headers["www-authenticate"] == "Bearer"
    assert closed.get("/api/v1/queues/gpu", headers=bearer(READ)).json()["paused"] is False


@pytest.mark.sqlite_only
def test_two_tokens_of_a_scope_both_work_while_rotating(db_url: str) -> None:
    old, new = "old-operate-token-0123", "new-operate-token-0123"
    server = ApiServer(db_url, access=Access(load_tokens({"FEEDPROC_OPERATE_TOKENS": f"{old},{new}"})))
    try:
        for token in (old, new):
            assert server.client.post("/api/v1/queues/q/pause", headers=bearer(token)).status_code == 200
        error_of(server.client.post("/api/v1/queues/q/pause", headers=bearer(TOKEN)), 401)
    finally:
        server.close()


@pytest.mark.sqlite_only
def test_the_openapi_document_says_which_calls_take_basic(closed: ApiServer) -> None:
    document = closed.get("/api/v1/openapi.json", headers=bearer(READ)).json()
    assert set(document["components"]["securitySchemes"]) == {"HTTPBearer", "HTTPBasic"}
    reads = document["paths"]["/api/v1/partitions"]["get"]["security"]
    assert {"HTTPBasic": []} in reads and {"HTTPBearer": []} in reads
    assert document["paths"]["/api/v1/answers"]["post"]["security"] == [{"HTTPBearer": []}]


# ---------------------------------------------------------------- worker tokens limited to queues


def claimed(server: ApiServer, queue: str, token: str) -> dict[str, object]:
    response = server.client.post(f"/api/v1/queues/{queue}/claim", json={"worker": "w"}, headers=bearer(token))
    assert response.status_code == 200, response.text
    (item,) = response.json()["items"]
    return item


def test_a_worker_token_limited_to_a_queue_may_not_claim_from_another(closed: ApiServer) -> None:
    refused = closed.client.post("/api/v1/queues/hr/claim", json={"worker": "w"}, headers=bearer(GPU))
    assert error_of(refused, 403) == "this token may not claim from queue 'hr'"
    assert claimed(closed, "gpu", GPU)["partition"] == "gpu-job"
    assert claimed(closed, "hr", WORKER)["partition"] == "hr-job"  # the unlimited one may


def test_a_worker_token_limited_to_a_queue_may_not_touch_another_queues_item(closed: ApiServer) -> None:
    item = claimed(closed, "hr", WORKER)  # its claim token leaked to the gpu worker
    path, token = f"/api/v1/items/{item['id']}", item["token"]
    for action, body in (
        ("answer", {"token": token, "done": True}),
        ("heartbeat", {"token": token}),
        ("release", {"token": token}),
    ):
        response = closed.client.post(f"{path}/{action}", json=body, headers=bearer(GPU))
        assert "not in a queue this token may work on" in error_of(response, 403), action
    assert closed.get(path, headers=bearer(READ)).json()["status"] == "available"
    done = closed.client.post(f"{path}/answer", json={"token": token, "done": True}, headers=bearer(WORKER))
    assert done.json()["outcome"] == "done"  # the claim held throughout


def test_a_batch_answer_is_refused_only_for_the_items_outside_the_tokens_queues(closed: ApiServer) -> None:
    mine, theirs = claimed(closed, "gpu", GPU), claimed(closed, "hr", WORKER)
    answers = [{"id": item["id"], "token": item["token"], "done": True} for item in (mine, theirs)]
    response = closed.client.post("/api/v1/answers", json={"answers": answers}, headers=bearer(GPU))
    first, second = response.json()["results"]
    assert (first["status"], first["outcome"]) == (200, "done")
    refused = f"item {theirs['id']} is not in a queue this token may work on"
    assert second == {"id": theirs["id"], "status": 403, "error": refused}
    assert closed.get(f"/api/v1/items/{theirs['id']}", headers=bearer(READ)).json()["status"] == "available"


# ---------------------------------------------------------------- feedproc serve


def test_serve_beyond_loopback_answers_reads_only_with_a_token(db_url: str, tmp_path: Path) -> None:
    feed = Feed(db_url)
    feed.add_partition("hr-1", [(0, b'{"salary": 1, "ssn": "x"}')], queue="hr")
    feed.close()
    serve = ServeProcess(db_url, tmp_path, "--host", "0.0.0.0", FEEDPROC_API_TOKEN=TOKEN)
    try:
        for path in ("/api/v1/items/1", "/api/v1/partitions", "/partitions/hr-1", "/items/1/data", "/metrics"):
            assert httpx.get(f"{serve.url}{path}").status_code == 401, path
        assert httpx.get(f"{serve.url}/api/v1/items/1", headers=AUTH).json()["data"]["salary"] == 1
        assert httpx.get(f"{serve.url}/items/1", headers=basic(TOKEN)).status_code == 200
        assert httpx.get(f"{serve.url}/healthz").status_code == 200
    finally:
        serve.stop()


@pytest.mark.sqlite_only
def test_serve_beyond_loopback_with_only_a_worker_token_refuses_to_start(db_url: str) -> None:
    result = run_cli(db_url, "serve", "--host", "0.0.0.0", "--port", "0", env={"FEEDPROC_WORKER_TOKEN": WORKER})
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "--public-read" in result.stderr and "FEEDPROC_READ_TOKENS" in result.stderr


@pytest.mark.sqlite_only
def test_serve_public_read_opens_reads_beyond_loopback_and_warns(db_url: str, tmp_path: Path) -> None:
    serve = ServeProcess(db_url, tmp_path, "--host", "0.0.0.0", "--public-read", FEEDPROC_WORKER_TOKEN=WORKER)
    try:
        assert httpx.get(f"{serve.url}/api/v1/partitions").status_code == 200
        assert httpx.post(f"{serve.url}/api/v1/queues/q/pause", headers=bearer(WORKER)).status_code == 403
    finally:
        serve.stop()
    assert "WARNING" in serve.log() and "--public-read" in serve.log()


@pytest.mark.sqlite_only
@pytest.mark.parametrize(
    ("environ", "says"),
    [
        ({"FEEDPROC_WORKER_TOKENS": "gpu:has space 0123456789"}, "FEEDPROC_WORKER_TOKENS entry 1"),
        ({"FEEDPROC_READ_TOKENS": f"{READ},short"}, "FEEDPROC_READ_TOKENS entry 2"),
    ],
)
def test_serve_refuses_an_unusable_token_naming_the_variable_not_the_value(
    db_url: str, environ: dict[str, str], says: str
) -> None:
    result = run_cli(db_url, "serve", "--port", "0", env=environ, timeout=30)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert says in result.stderr and "short" not in result.stderr and "space" not in result.stderr


@pytest.mark.sqlite_only
def test_serve_takes_scoped_tokens_from_a_file(db_url: str, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"read {READ}  # dashboards\nworker gpu:{GPU}\n")
    serve = ServeProcess(db_url, tmp_path, "--host", "0.0.0.0", "--tokens-file", str(tokens))
    try:
        assert httpx.get(f"{serve.url}/api/v1/partitions", headers=bearer(READ)).status_code == 200
        assert httpx.get(f"{serve.url}/api/v1/partitions", headers=bearer(GPU)).status_code == 403
        claim = httpx.post(f"{serve.url}/api/v1/queues/hr/claim", json={"worker": "w"}, headers=bearer(GPU))
        assert claim.status_code == 403
    finally:
        serve.stop()


@pytest.mark.sqlite_only
def test_serve_answers_only_to_its_own_host_names(db_url: str, tmp_path: Path) -> None:
    """DNS rebinding: a page of evil.example whose name now points at 127.0.0.1 sends Host: evil.example."""
    serve = ServeProcess(db_url, tmp_path, "--allowed-host", "feedproc.internal", "--allowed-host", "*.svc.local")
    port = serve.url.rsplit(":", 1)[1]
    try:
        for host in ("evil.example", f"evil.example:{port}", "feedproc.internal.evil.example"):
            for path in ("/api/v1/partitions", "/", "/healthz"):
                response = httpx.get(f"{serve.url}{path}", headers={"Host": host})
                assert f"host {host!r} is not allowed; see --allowed-host" == error_of(response, 400), path
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "feedproc.internal", f"api.svc.local:{port}"):
            assert httpx.get(f"{serve.url}/api/v1/partitions", headers={"Host": host}).status_code == 200, host
    finally:
        serve.stop()


@pytest.mark.sqlite_only
def test_serve_checks_the_token_before_it_reads_the_body(db_url: str, tmp_path: Path) -> None:
    serve = ServeProcess(db_url, tmp_path, FEEDPROC_API_TOKEN=TOKEN)
    try:
        json_type = {"Content-Type": "application/json"}
        bad = httpx.post(f"{serve.url}/api/v1/partitions", content=b"{bad", headers=json_type)
        assert "bearer token" in error_of(bad, 401)
        port = int(serve.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            started = time.monotonic()
            conn.sendall(  # a body under --max-body-bytes, announced and never sent
                b"POST /api/v1/partitions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 5000000\r\n\r\n"
            )
            head = conn.recv(4096)
        assert head.startswith(b"HTTP/1.1 401"), head
        assert time.monotonic() - started < 5
    finally:
        serve.stop()
