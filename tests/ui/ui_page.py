"""Driving the web UI's page from the tests: waits that survive redraws, visiting a page (one
redraw), reading a table's row by name, clicking, answering the confirmation dialog, reading the
message line, logging in through the form; and the pika helpers the checks use."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tqbroker.testing import RunningBroker

TIMEOUT = 10


def wait(browser: WebDriver, condition: Callable[[WebDriver], Any], what: str) -> Any:
    return WebDriverWait(
        browser, TIMEOUT, ignored_exceptions=[StaleElementReferenceException]
    ).until(condition, f"the page never showed {what}")


def text_of(browser: WebDriver, element_id: str) -> str:
    found = browser.find_elements(By.ID, element_id)
    return found[0].text if found and found[0].is_displayed() else ""


def redrawn(browser: WebDriver, action: Callable[[], object], what: str) -> str:
    """Do ``action`` and wait until the page is drawn afresh; the view's text."""
    before = browser.find_element(By.ID, "view").get_attribute("data-loaded")
    action()
    wait(
        browser,
        lambda b: b.find_element(By.ID, "view").get_attribute("data-loaded") not in (None, before),
        what,
    )
    return str(browser.find_element(By.ID, "view").text)


def show(browser: WebDriver, page: str) -> str:
    """Go to ``#/page`` and wait until it is drawn afresh; the view's text."""
    script = (  # one redraw: the hash changes, or the same page is asked for again
        "if (location.hash === arguments[0])"
        " window.dispatchEvent(new HashChangeEvent('hashchange'));"
        " else location.hash = arguments[0];"
    )
    return redrawn(browser, lambda: browser.execute_script(script, "#/" + page), f"page {page}")


def row(browser: WebDriver, table: str, name: str) -> str:
    """The text of the row named ``name`` in table ``table`` (waits for it)."""
    selector = f'#{table} tr[data-name="{name}"]'
    return str(wait(browser, lambda b: b.find_element(By.CSS_SELECTOR, selector).text, selector))


def click(browser: WebDriver, selector: str) -> None:
    def clicked(b: WebDriver) -> bool:
        b.find_element(By.CSS_SELECTOR, selector).click()
        return True

    wait(browser, clicked, selector)


def confirm(browser: WebDriver, artifacts: Path, shot: str, reason: str | None = None) -> None:
    """Answer the open confirmation dialog with OK (typing ``reason`` first)."""
    wait(
        browser,
        lambda b: b.find_element(By.ID, "confirm").get_attribute("open") is not None,
        "a dialog",
    )
    if reason is not None:
        field = browser.find_element(By.ID, "confirm-reason")
        field.clear()
        field.send_keys(reason)
    browser.save_screenshot(str(artifacts / shot))
    browser.find_element(By.ID, "confirm-ok").click()


def flash(browser: WebDriver, words: str) -> str:
    return str(wait(browser, lambda b: words in text_of(b, "flash") and text_of(b, "flash"), words))


def connect(broker: RunningBroker, name: str) -> pika.BlockingConnection:
    parameters = pika.URLParameters(broker.url)
    parameters.client_properties = {"connection_name": name}
    return pika.BlockingConnection(parameters)


def drain(connection: pika.BlockingConnection) -> None:
    """Process the connection's events for up to ``TIMEOUT`` seconds (until it is closed)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)


def log_in(browser: WebDriver, user: str, password: str) -> None:
    """Fill in and send the login form, and wait for the first page (or the refusal)."""
    wait(browser, lambda b: b.find_element(By.ID, "username").is_displayed(), "the login form")
    before = browser.find_element(By.ID, "view").get_attribute("data-loaded")
    browser.find_element(By.ID, "username").clear()
    browser.find_element(By.ID, "username").send_keys(user)
    browser.find_element(By.ID, "password").send_keys(password)
    browser.find_element(By.ID, "login-button").click()
    wait(
        browser,
        lambda b: (
            text_of(b, "login-error")
            or b.find_element(By.ID, "view").get_attribute("data-loaded") not in (None, before)
        ),
        "a page or a refusal",
    )
