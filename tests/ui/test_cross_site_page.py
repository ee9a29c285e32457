"""A page on another origin attacks the broker through a victim's headless Chromium, and nothing
changes: the victim logged in to the web UI in the same browser and opened an ``/api`` URL with
credentials in it, and the browser sends the victim's credentials with every request it makes
(CDP's extra headers: the worst a cached Basic login could do; before ``cross_site.py`` every
attack below succeeded so, while the URL's credentials alone were not sent). The attacker's
page, served on another loopback origin (127.0.0.1 on another port: same site; 127.0.0.2:
another site), submits forms (``text/plain``, urlencoded, multipart) and ``no-cors`` fetches to
publish, bind, delete users, get (consume) a message, import definitions (an administrator)
and produce to a topic. Afterwards the broker is as it was, checked over the API."""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pika
import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from tqbroker.testing import RunningBroker

from .ui_page import log_in, wait

PUBLISH = {"routing_key": "victim", "payload": "x", "payload_encoding": "string", "properties": {}}
GET = {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}
INTRUDER = {"name": "intruder", "password": "pw", "tags": "administrator"}
DEFINITIONS = {"users": [INTRUDER], "permissions": [], "queues": [{"name": "planted"}]}
TOPIC_RECORDS = {"records": [{"value": "forged"}]}


def text_plain(body: dict[str, Any]) -> tuple[str, str]:
    """A text/plain form's one field whose ``name=value`` is ``body`` as JSON (and a pad)."""
    text = json.dumps({**body, "pad": ""})
    return text[:-2], text[-2:]  # ... "pad": "  =  "}


ATTACK_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>cat pictures</title></head><body>
<script>
const target = %(target)s;
const writes = %(writes)s;
const results = [];
function form(path, enctype, fields) {
  const frame = document.createElement("iframe");
  frame.name = "f" + results.length;
  document.body.append(frame);
  const f = document.createElement("form");
  Object.assign(f, {method: "POST", action: target + path, enctype, target: frame.name});
  for (const [name, value] of fields) {
    const input = document.createElement("input");
    Object.assign(input, {type: "hidden", name, value});
    f.append(input);
  }
  document.body.append(f);
  f.submit();
  results.push(new Promise((done) => { frame.onload = done; setTimeout(done, 3000); }));
}
function noCors(path, body) {
  results.push(fetch(target + path, {method: "POST", mode: "no-cors", credentials: "include", body})
    .catch(() => null));
}
for (const [path, body, name, value] of writes) {
  form(path, "text/plain", [[name, value]]);
  form(path, "application/x-www-form-urlencoded", []);  // an empty body: {}
  form(path, "multipart/form-data", [["file", body]]);
  noCors(path, body);  // text/plain
  noCors(path, new Blob([body]));  // no content type at all
  noCors(path, new URLSearchParams());
  const data = new FormData();
  data.append("file", new Blob([body], {type: "application/json"}), "defs.json");
  noCors(path, data);
}
Promise.all(results).then(() => { document.title = "done"; });
</script></body></html>
"""

WRITES: list[tuple[str, dict[str, Any]]] = [
    ("/api/exchanges/%2F/amq.default/publish", PUBLISH),
    ("/api/bindings/%2F/e/amq.fanout/q/victim", {"routing_key": "#"}),
    ("/api/users/bulk-delete", {"users": ["victim-user"]}),
    ("/api/queues/%2F/victim/get", GET),
    ("/api/definitions", DEFINITIONS),
    ("/api/definitions/%2F", DEFINITIONS),
    ("/topics/victim-topic/messages", TOPIC_RECORDS),
]


def serving(page: bytes) -> type[http.server.BaseHTTPRequestHandler]:
    """A request handler answering every GET with ``page``."""

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Attacker


@pytest.fixture(scope="module")
def scene(broker: RunningBroker, api: httpx.Client) -> None:
    """A queue with a message, a user, a topic: what the attacks would change."""
    assert api.put("/api/queues/%2F/victim", json={"durable": True}).status_code == 201
    user = {"password": "pw", "tags": "management"}
    assert api.put("/api/users/victim-user", json=user).status_code == 201
    assert api.put("/topics/victim-topic", json={"partitions": 1}).status_code == 201
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    connection.channel().basic_publish("", "victim", b"kept")
    connection.close()


def state(api: httpx.Client) -> dict[str, Any]:
    """What the attacks would change, as the API shows it."""
    peek = {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"}
    users = {u["name"] for u in api.get("/api/users").json()}
    return {
        "messages": [
            m["payload"] for m in api.post("/api/queues/%2F/victim/get", json=peek).json()
        ],
        "bindings": [b["source"] for b in api.get("/api/queues/%2F/victim/bindings").json()],
        "victim-user": "victim-user" in users,
        "intruder": "intruder" in users,
        "planted": api.get("/api/queues/%2F/planted").status_code != 404,
        "topic": api.get("/topics/victim-topic/offsets").json()["partitions"][0]["latest"],
    }


UNCHANGED = {
    "messages": ["kept"],
    "bindings": [""],
    "victim-user": True,
    "intruder": False,
    "planted": False,
    "topic": 0,
}


@pytest.fixture(scope="module", params=["127.0.0.1", "127.0.0.2"], ids=["same-site", "cross-site"])
def attacker(request: pytest.FixtureRequest, broker: RunningBroker) -> Iterator[str]:
    """The attacker's page, on another origin; its address."""
    writes = [[path, json.dumps(body), *text_plain(body)] for path, body in WRITES]
    page = ATTACK_PAGE % {"target": json.dumps(broker.http_url), "writes": json.dumps(writes)}
    server = http.server.ThreadingHTTPServer((request.param, 0), serving(page.encode()))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{request.param}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_an_attacker_page_changes_nothing(
    browser: WebDriver, broker: RunningBroker, api: httpx.Client, scene: None, attacker: str
) -> None:
    # The victim: logged in to the web UI, and once opened an API URL with credentials.
    browser.get(broker.http_url + "/")
    browser.execute_script("sessionStorage.clear()")  # an earlier run's login
    browser.get(broker.http_url + "/")
    log_in(browser, "guest", "guest")
    host = broker.http_url.removeprefix("http://")
    browser.get(f"http://guest:guest@{host}/api/whoami")
    # The worst case: the browser sends the victim's credentials with every request.
    basic = "Basic " + base64.b64encode(b"guest:guest").decode()
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": basic}})
    try:
        browser.get(attacker)
        wait(browser, lambda b: b.title == "done", "the attack done")
    finally:
        browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})
    assert state(api) == UNCHANGED
    # The victim's own UI still works in that browser.
    browser.get(broker.http_url + "/#/queues")
    wait(browser, lambda b: "victim" in b.find_element("id", "view").text, "the queues page")
