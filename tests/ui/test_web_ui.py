"""The web UI in a real headless Chromium: it logs in through its form, its pages show what the
broker holds (queues, exchanges, bindings, a pika connection, a topic's partitions and a group's
lag, an alarm), a user sees only their vhosts, and a purge, a queue deletion, a connection close
and a definitions export and import done by clicking take effect, checked over AMQP and the API.
Each page's screenshot is kept (``conftest.py`` says where)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pika
import pika.exceptions
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tqbroker.config import BrokerConfig
from tqbroker.testing import RunningBroker, running_broker

from .ui_page import (
    click,
    confirm,
    connect,
    drain,
    flash,
    log_in,
    redrawn,
    row,
    show,
    text_of,
    wait,
)


@pytest.fixture(scope="module")
def scene(broker: RunningBroker, api: httpx.Client) -> Iterator[pika.BlockingConnection]:
    """What the pages show: queues with messages, a topic exchange and its bindings, a topic of
    3 partitions with a consumer group 2 records behind on partition 0, and an open connection."""
    connection = connect(broker, "ui-scene")
    channel = connection.channel()
    channel.exchange_declare("ui-events", "topic", durable=True)
    for queue, count in (("ui-orders", 3), ("ui-purged", 4), ("ui-deleted", 1)):
        channel.queue_declare(queue, durable=True)
        for n in range(count):
            channel.basic_publish("", queue, f"{queue} {n}".encode())
    channel.queue_bind("ui-orders", "ui-events", "order.#")
    other = "/api/queues/ui%2Fops/ui-ops"  # in the vhost ui/ops (other_vhost), by the API
    assert api.put(other, json={"durable": True}).status_code == 201
    for n in range(2):
        message = {"properties": {}, "routing_key": "ui-ops", "payload": str(n)}
        published = api.post("/api/exchanges/ui%2Fops/amq.default/publish", json=message)
        assert published.json() == {"routed": True}, published.text
    assert api.put("/topics/ui-clicks", json={"partitions": 3}).status_code == 201
    for n in range(10):
        record = {"value": f"click {n}", "partition": n % 2}
        assert api.post("/topics/ui-clicks/messages", json=record).status_code == 201
    reader = connection.channel()
    reader.basic_qos(prefetch_count=3)
    acked: list[int] = []

    def on_message(ch: Any, method: Any, _properties: Any, _body: bytes) -> None:
        if len(acked) < 3:  # the group commits 3 of partition 0's 5 records: lag 2
            ch.basic_ack(method.delivery_tag)
            acked.append(method.delivery_tag)

    reader.basic_consume(
        "ui-clicks-0",
        on_message,
        arguments={"x-stream-group": "ui-readers", "x-stream-offset": "first"},
    )
    deadline = time.monotonic() + 5
    while len(acked) < 3 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    connection.process_data_events(time_limit=0.2)
    yield connection
    if connection.is_open:
        connection.close()


@pytest.fixture(scope="module")
def page(browser: WebDriver, broker: RunningBroker, scene: Any, artifacts: Path) -> WebDriver:
    """The UI, logged in as guest through its form (a wrong password refused first)."""
    browser.get(broker.http_url + "/")
    log_in(browser, "guest", "wrong")
    assert "refused" in text_of(browser, "login-error")
    assert not browser.find_element(By.ID, "session").is_displayed()  # nothing but the form
    assert not browser.find_element(By.ID, "nav").is_displayed()
    browser.save_screenshot(str(artifacts / "login-refused.png"))
    log_in(browser, "guest", "guest")
    assert text_of(browser, "whoami") == "guest"
    # No redraws behind the tests' backs: each check draws its page afresh.
    browser.find_element(By.CSS_SELECTOR, '#refresh option[value="0"]').click()
    return browser


def test_overview_shows_node_version_totals_and_alarms(
    page: WebDriver, api: httpx.Client, artifacts: Path
) -> None:
    overview = api.get("/api/overview").json()
    text = show(page, "overview")
    page.save_screenshot(str(artifacts / "overview.png"))
    assert overview["node"] in text
    assert f"{overview['product_name']} {overview['product_version']}" in text
    assert page.find_element(By.ID, "no-alarms").text == "none"
    totals = page.find_element(By.ID, "overview").text
    assert f"Total\n{overview['queue_totals']['messages']}" in totals
    assert f"Queues\n{overview['object_totals']['queues']}" in totals
    assert "Connections\n1" in totals


def test_queues_page_lists_queues_with_depth(page: WebDriver, artifacts: Path) -> None:
    show(page, "queues")
    page.save_screenshot(str(artifacts / "queues.png"))
    orders = row(page, "queues", "ui-orders").split()
    # vhost, name, type, features, state, ready, unacked, total, ..., consumers
    assert orders[:8] == ["/", "ui-orders", "classic", "D", "running", "3", "0", "3"]
    assert "stream" in row(page, "queues", "ui-clicks-0")


def test_the_name_filter_narrows_a_list(page: WebDriver, artifacts: Path) -> None:
    show(page, "queues")

    def filter_by(words: str) -> list[str | None]:
        field = page.find_element(By.ID, "filter")
        field.clear()
        field.send_keys(words)
        submit = page.find_element(By.CSS_SELECTOR, "#filter-form button")
        redrawn(page, submit.click, f"the queues named like {words!r}")
        return [
            r.get_attribute("data-name")
            for r in page.find_elements(By.CSS_SELECTOR, "#queues tbody tr")
        ]

    try:
        assert filter_by("ui-clicks-") == ["ui-clicks-0", "ui-clicks-1", "ui-clicks-2"]
        page.save_screenshot(str(artifacts / "queues-filtered.png"))
        assert filter_by("nothing-like-it") == []
        assert "No queues." in page.find_element(By.ID, "view").text
    finally:
        filter_by("")
    assert len(page.find_elements(By.CSS_SELECTOR, "#queues tbody tr")) > 3


def test_exchanges_page_lists_exchanges_and_bindings(page: WebDriver, artifacts: Path) -> None:
    text = show(page, "exchanges")
    page.save_screenshot(str(artifacts / "exchanges.png"))
    assert row(page, "exchanges", "ui-events").split()[:4] == ["/", "ui-events", "topic", "D"]
    assert row(page, "exchanges", "ui-clicks").split()[2] == "x-key-partition"
    assert "/ ui-events ui-orders queue order.#" in text
    assert "(AMQP default)" in text


def test_connections_page_lists_connections(
    page: WebDriver, api: httpx.Client, artifacts: Path
) -> None:
    (listed,) = api.get("/api/connections").json()
    show(page, "connections")
    page.save_screenshot(str(artifacts / "connections.png"))
    text = row(page, "connections", listed["name"])
    assert "guest" in text
    assert f"{listed['peer_host']}:{listed['peer_port']}" in text
    assert "ui-scene" in text  # the client's connection_name


def test_the_page_redraws_itself_every_5_s(page: WebDriver, api: httpx.Client) -> None:
    show(page, "queues")
    assert row(page, "queues", "ui-orders").split()[5] == "3"  # ready
    message = {"properties": {}, "routing_key": "ui-orders", "payload": "one more"}
    assert api.post("/api/exchanges/%2F/amq.default/publish", json=message).json()["routed"]
    page.find_element(By.CSS_SELECTOR, '#refresh option[value="5"]').click()
    try:
        wait(
            page,
            lambda b: row(b, "queues", "ui-orders").split()[5] == "4",
            "the new message without being asked",
        )
    finally:
        page.find_element(By.CSS_SELECTOR, '#refresh option[value="0"]').click()


def test_topics_pages_show_partitions_and_group_lag(page: WebDriver, artifacts: Path) -> None:
    show(page, "topics")
    page.save_screenshot(str(artifacts / "topics.png"))
    assert row(page, "topics", "ui-clicks").split() == ["/", "ui-clicks", "3"]
    redrawn(page, lambda: click(page, '#topics tr[data-name="ui-clicks"] a'), "the topic")
    partitions = page.find_element(By.ID, "partitions").text.splitlines()[1:]
    assert [p.split()[:2] for p in partitions] == [
        ["0", "ui-clicks-0"],
        ["1", "ui-clicks-1"],
        ["2", "ui-clicks-2"],
    ]
    assert [p.split()[3] for p in partitions] == ["5", "5", "0"]  # log end
    group = page.find_element(By.ID, "group-name")
    group.clear()
    group.send_keys("ui-readers")
    submit = page.find_element(By.CSS_SELECTOR, "#group-form button")
    text = redrawn(page, submit.click, "the group's lag")
    page.save_screenshot(str(artifacts / "topic.png"))
    assert "Group 'ui-readers': lag 2" in text
    lag = page.find_element(By.ID, "lag-ui-readers")
    # partition, committed, log end, lag, consumer
    assert lag.text.splitlines()[1].split()[:4] == ["0", "3", "5", "2"]


def test_purge_through_the_ui_empties_the_queue(
    page: WebDriver, scene: pika.BlockingConnection, artifacts: Path
) -> None:
    channel = scene.channel()
    assert channel.queue_declare("ui-purged", passive=True).method.message_count == 4
    show(page, "queues")
    click(page, '#queues tr[data-name="ui-purged"] button.purge')
    confirm(page, artifacts, "purge-confirm.png")
    flash(page, "Queue 'ui-purged' purged.")
    assert channel.queue_declare("ui-purged", passive=True).method.message_count == 0
    assert row(page, "queues", "ui-purged").split()[5:8] == ["0", "0", "0"]
    channel.close()


def test_vhost_selection_narrows_the_lists_and_names_travel_encoded(
    page: WebDriver, broker: RunningBroker, other_vhost: str, artifacts: Path
) -> None:
    show(page, "queues")
    assert row(page, "queues", "ui-ops").split()[:3] == [other_vhost, "ui-ops", "classic"]
    click(page, f'#vhost option[value="{other_vhost}"]')
    wait(page, lambda b: "ui-orders" not in b.find_element(By.ID, "view").text, "one vhost")
    page.save_screenshot(str(artifacts / "queues-one-vhost.png"))
    (only,) = page.find_elements(By.CSS_SELECTOR, "#queues tbody tr")
    assert only.get_attribute("data-name") == "ui-ops"
    click(page, '#queues tr[data-name="ui-ops"] button.purge')
    confirm(page, artifacts, "purge-other-vhost.png")
    flash(page, "Queue 'ui-ops' purged.")
    parameters = pika.URLParameters(broker.url + quote(other_vhost, safe=""))
    connection = pika.BlockingConnection(parameters)
    try:
        declared = connection.channel().queue_declare("ui-ops", passive=True)
        assert declared.method.message_count == 0
    finally:
        connection.close()
        click(page, '#vhost option[value=""]')


def test_delete_through_the_ui_deletes_the_queue(
    page: WebDriver, scene: pika.BlockingConnection, artifacts: Path
) -> None:
    show(page, "queues")
    click(page, '#queues tr[data-name="ui-deleted"] button.delete')
    confirm(page, artifacts, "delete-confirm.png")
    flash(page, "Queue 'ui-deleted' deleted.")
    channel = scene.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_declare("ui-deleted", passive=True)
    assert closed.value.reply_code == 404
    assert not page.find_elements(By.CSS_SELECTOR, '#queues tr[data-name="ui-deleted"]')


def test_a_failed_action_is_reported(page: WebDriver, api: httpx.Client, artifacts: Path) -> None:
    """A queue deleted behind the page's back: purging it says why it failed, in one line."""
    assert api.put("/api/queues/%2F/ui-vanishing", json={}).status_code == 201
    show(page, "queues")
    row(page, "queues", "ui-vanishing")
    assert api.delete("/api/queues/%2F/ui-vanishing").status_code == 204
    click(page, '#queues tr[data-name="ui-vanishing"] button.purge')
    confirm(page, artifacts, "purge-vanished-confirm.png")
    message = flash(page, "404")
    page.save_screenshot(str(artifacts / "purge-failed.png"))
    assert message.startswith("DELETE api/queues/%2F/ui-vanishing/contents: 404 ")
    assert "\n" not in message
    assert page.find_element(By.ID, "flash").get_attribute("class") == "error"
    assert not page.find_elements(By.CSS_SELECTOR, '#queues tr[data-name="ui-vanishing"]')


def test_close_through_the_ui_closes_the_connection(
    page: WebDriver, broker: RunningBroker, api: httpx.Client, artifacts: Path
) -> None:
    doomed = connect(broker, "ui-doomed")
    (name,) = [
        c["name"]
        for c in api.get("/api/connections").json()
        if c.get("client_properties", {}).get("connection_name") == "ui-doomed"
    ]
    show(page, "connections")
    click(page, f'#connections tr[data-name="{name}"] button.close')
    confirm(page, artifacts, "close-confirm.png", reason="maintenance window 42")
    flash(page, "closed.")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        drain(doomed)
    assert closed.value.reply_code == 320
    assert "maintenance window 42" in closed.value.reply_text
    show(page, "connections")
    assert name not in page.find_element(By.ID, "view").text


def test_definitions_export_downloads_and_import_declares(
    page: WebDriver,
    api: httpx.Client,
    scene: pika.BlockingConnection,
    artifacts: Path,
    downloads: Path,
    tmp_path: Path,
) -> None:
    show(page, "definitions")
    page.save_screenshot(str(artifacts / "definitions.png"))
    if api.get("/api/definitions").status_code == 404:
        pytest.skip("this build has no /api/definitions (issue 15 item 1) to export or import")
    click(page, "#export")
    flash(page, "downloaded")
    files = wait(page, lambda b: [p for p in downloads.glob("*.json")], "a downloaded file")
    exported = json.loads(files[0].read_text())
    assert "ui-orders" in {q["name"] for q in exported["queues"]}
    assert {"source": "ui-events", "destination": "ui-orders"}.items() <= next(
        b for b in exported["bindings"] if b["source"] == "ui-events"
    ).items()
    imported = {
        "queues": [
            {
                "name": "ui-imported",
                "vhost": "/",
                "durable": True,
                "auto_delete": False,
                "arguments": {},
            }
        ]
    }
    upload = tmp_path / "ui-import.json"
    upload.write_text(json.dumps(imported))
    page.find_element(By.ID, "definitions-file").send_keys(str(upload))
    page.find_element(By.ID, "import").click()
    flash(page, "imported")
    assert scene.channel().queue_declare("ui-imported", passive=True).method.message_count == 0


def test_a_user_sees_only_their_vhosts_and_a_refusal_keeps_them_logged_in(
    page: WebDriver, other_vhost: str, artifacts: Path
) -> None:
    click(page, "#logout")
    try:
        log_in(page, "ui-viewer", "viewer")
        assert text_of(page, "whoami") == "ui-viewer"
        show(page, "queues")
        rows = page.find_elements(By.CSS_SELECTOR, "#queues tbody tr")
        assert [r.get_attribute("data-name") for r in rows] == ["ui-ops"]
        # A topic of a vhost this user may not use: the API refuses (403), the page says so.
        page.execute_script("location.hash = arguments[0]", "#/topics/%2F/ui-clicks")
        assert "no access to vhost '/'" in flash(page, "no access")
        page.save_screenshot(str(artifacts / "refused-vhost.png"))
        assert text_of(page, "whoami") == "ui-viewer"  # still logged in
        # The management API's refusal is a 401 too (RabbitMQ's not_authorised, "Access
        # refused."), as when access to a vhost is revoked while its page is open: not a logout.
        show(page, "queues")
        page.execute_script(
            "const select = document.getElementById('vhost');"
            "select.add(new Option('/', '/')); select.value = '/';"
            "select.dispatchEvent(new Event('change'));"
        )
        assert "401 Access refused." in flash(page, "Access refused")
        assert text_of(page, "whoami") == "ui-viewer"
    finally:
        click(page, "#logout")
        log_in(page, "guest", "guest")
        page.find_element(By.CSS_SELECTOR, '#refresh option[value="0"]').click()


def test_overview_shows_a_resource_alarm(
    page: WebDriver, broker: RunningBroker, artifacts: Path
) -> None:
    """A broker whose data directory is always short of space (another origin for the browser:
    a login of its own)."""
    with running_broker(BrokerConfig(port=0, disk_free_limit="1000TB")) as alarmed:
        try:
            page.get(alarmed.http_url + "/")
            log_in(page, "guest", "guest")
            found = wait(
                page,
                lambda b: "disk space" in show(b, "overview") and b.find_element(By.ID, "overview"),
                "the disk alarm",
            )
            page.save_screenshot(str(artifacts / "overview-alarm.png"))
            assert "disk space" in found.find_element(By.CSS_SELECTOR, ".alarm").text
            assert not page.find_elements(By.ID, "no-alarms")
        finally:
            page.get(broker.http_url + "/")  # the module's broker, still logged in (this tab)
            wait(page, lambda b: b.find_element(By.ID, "view").get_attribute("data-loaded"), "it")
    assert text_of(page, "whoami") == "guest"
