"""What a page on another site can make a browser send, refused (``server/http/cross_site.py``):
the bodies an HTML form or a ``no-cors`` fetch sends without a CORS preflight (``text/plain``,
urlencoded, multipart) on every state-changing route, and any request a browser says comes from
another origin (``Sec-Fetch-Site``, else ``Origin``); the broker is unchanged after them all.
The same requests from the server's own origin, or from clients that are no browsers, work;
and a 401 asks a browser for no Basic credentials (it would keep them and send them along
with other sites' requests). The real browser's run is ``tests/ui/test_cross_site_page.py``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pika
import pytest

from tqbroker.testing import RunningBroker

PUBLISH = {"routing_key": "victim", "payload": "x", "payload_encoding": "string", "properties": {}}
GET = {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}
INTRUDER = {"name": "intruder", "password": "pw", "tags": "administrator"}
DEFINITIONS = {"users": [INTRUDER], "permissions": []}
RECORDS = {"records": [{"value": "x"}]}
JSON = "application/json"

# (what, method, path, body): each changes the broker when it is served.
WRITES: list[tuple[str, str, str, dict[str, Any]]] = [
    ("publish", "POST", "/api/exchanges/%2F/amq.default/publish", PUBLISH),
    ("bind", "POST", "/api/bindings/%2F/e/amq.fanout/q/victim", {"routing_key": "#"}),
    ("bulk-delete users", "POST", "/api/users/bulk-delete", {"users": ["victim-user"]}),
    ("queue get", "POST", "/api/queues/%2F/victim/get", GET),
    ("import definitions", "POST", "/api/definitions", DEFINITIONS),
    ("declare queue", "PUT", "/api/queues/%2F/planted", {"durable": True}),
    ("produce", "POST", "/topics/t/messages", RECORDS),
]
FORM_TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b"]
# What a browser sends with another site's request (to this server's own address).
CROSS_SITE: list[dict[str, str]] = [
    {"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors"},
    {"sec-fetch-site": "same-site", "sec-fetch-mode": "no-cors"},  # another port, same host
    {"origin": "http://127.0.0.2:8000"},  # a browser without Sec-Fetch-*
    {"origin": "http://127.0.0.1:1"},  # without Sec-Fetch-*: this host, another port
    {"origin": "null"},  # a sandboxed frame, a redirect
]


def scene(http: httpx.Client, broker: RunningBroker) -> None:
    """A queue with a message, a user, a topic: what the attacks would change."""
    assert http.put("/api/queues/%2F/victim", json={"durable": True}).status_code == 201
    user = {"password": "pw", "tags": "management"}
    assert http.put("/api/users/victim-user", json=user).status_code == 201
    assert http.put("/topics/t", json={"partitions": 1}).status_code in (200, 201)
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    connection.channel().basic_publish("", "victim", b"kept")
    connection.close()


def unchanged(http: httpx.Client) -> None:
    queue = http.get("/api/queues/%2F/victim").json()
    assert queue["messages"] == 1
    assert [b["source"] for b in http.get("/api/queues/%2F/victim/bindings").json()] == [""]
    names = {u["name"] for u in http.get("/api/users").json()}
    assert "victim-user" in names
    assert "intruder" not in names
    assert http.get("/api/queues/%2F/planted").status_code == 404
    assert http.get("/topics/t/offsets").json()["partitions"][0]["latest"] == 0


def send(
    http: httpx.Client, method: str, path: str, body: object, headers: dict[str, str] | None = None
) -> httpx.Response:
    return http.request(method, path, content=json.dumps(body), headers=headers)


def test_form_bodies_and_other_sites_change_nothing(
    http: httpx.Client, tqbroker_thread: RunningBroker
) -> None:
    scene(http, tqbroker_thread)
    for what, method, path, body in WRITES:
        for kind in FORM_TYPES:
            refused = send(http, method, path, body, {"content-type": kind})
            assert refused.status_code == 415, (what, kind, refused.text)
        for browser in CROSS_SITE:
            refused = send(http, method, path, body, {"content-type": JSON, **browser})
            assert refused.status_code == 403, (what, browser, refused.text)
            assert "cross-site" in refused.text
    # A POST to the management API without a content type (a no-cors fetch of bytes).
    assert send(http, "POST", "/api/exchanges/%2F/amq.default/publish", PUBLISH).status_code == 415
    unchanged(http)
    # Reads from another site are refused too (a GET may act: aliveness-test, a group's read).
    for path in ("/api/overview", "/api/aliveness-test/%2F", "/topics/t/offsets"):
        assert http.get(path, headers=CROSS_SITE[0]).status_code == 403, path
    # The page, its scripts and the health check may be linked to from anywhere.
    for path in ("/", "/ui/app.js", "/health"):
        assert http.get(path, headers=CROSS_SITE[0]).status_code == 200, path


def test_the_servers_own_origin_and_other_clients_are_served(
    http: httpx.Client, tqbroker_thread: RunningBroker
) -> None:
    scene(http, tqbroker_thread)
    own = tqbroker_thread.http_url  # http://127.0.0.1:PORT
    for browser in (
        {"sec-fetch-site": "same-origin", "sec-fetch-mode": "cors", "origin": own},
        {"sec-fetch-site": "none"},  # typed in the address bar
        {"origin": own},
        {},  # curl, rabbitmqadmin, tqbroker-ctl
    ):
        _, method, path, body = WRITES[0]
        headers = {"content-type": f"{JSON}; charset=utf-8", **browser}
        published = send(http, method, path, body, headers)
        assert published.json() == {"routed": True}, browser
    assert http.get("/api/queues/%2F/victim").json()["messages"] == 5
    # A write without a body needs no content type; the topic API takes its own types.
    assert http.put("/api/vhosts/bare").status_code == 201
    assert http.delete("/api/vhosts/bare").status_code == 204
    assert http.post("/topics/t/messages", content=json.dumps(RECORDS)).status_code == 201


@pytest.mark.parametrize("path", ["/api/overview", "/topics/t/offsets"])
def test_a_browser_is_not_asked_for_basic_credentials(
    tqbroker_thread: RunningBroker, path: str
) -> None:
    url = tqbroker_thread.http_url + path
    browser = httpx.get(url, headers={"sec-fetch-mode": "navigate", "sec-fetch-site": "none"})
    assert browser.status_code == 401
    assert "www-authenticate" not in browser.headers
    client = httpx.get(url)  # other clients still get the challenge, as RabbitMQ's
    assert client.status_code == 401
    assert client.headers["www-authenticate"].startswith("Basic")
