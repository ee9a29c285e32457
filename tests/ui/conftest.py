"""Fixtures of the web UI's tests: one broker and one headless Chromium (through chromedriver,
both on loopback) for the whole module, a page logged in through the login form, and the
directory where screenshots are kept ($TQBROKER_UI_ARTIFACTS, else ``tests-artifacts/ui/`` at the
repository's root); a failing test leaves a screenshot of what the browser showed there too."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

from tqbroker.config import BrokerConfig, PermissionConfig, UserConfig
from tqbroker.testing import RunningBroker, running_broker

ARTIFACTS_ENV = "TQBROKER_UI_ARTIFACTS"
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = next(
    filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None
)
CHROMEDRIVER = shutil.which("chromedriver")

NO_BROWSER = (
    "the web UI's browser tests need a headless browser: install Debian's chromium and "
    "chromium-driver packages (apt-get install chromium chromium-driver)"
)


@pytest.fixture(scope="module")
def artifacts() -> Path:
    """Where screenshots go (kept by CI)."""
    path = Path(os.environ.get(ARTIFACTS_ENV) or ROOT / "tests-artifacts" / "ui")
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("FAILED-*.png"):  # an earlier run's failures
        stale.unlink()
    return path


@pytest.fixture(scope="module")
def other_vhost() -> str:
    """The broker's second vhost, whose name needs encoding in a URL path (``ui%2Fops``)."""
    return "ui/ops"


@pytest.fixture(scope="module")
def broker(other_vhost: str) -> Iterator[RunningBroker]:
    """guest, and ``ui-viewer`` (password ``viewer``) who may use only the other vhost."""
    users = (
        UserConfig(
            "guest",
            "guest",
            tags=("administrator",),
            permissions={"/": PermissionConfig(), other_vhost: PermissionConfig()},
        ),
        UserConfig(
            "ui-viewer",
            "viewer",
            tags=("management",),
            permissions={other_vhost: PermissionConfig()},
        ),
    )
    config = BrokerConfig(port=0, vhosts=("/", other_vhost), users=users)
    with running_broker(config) as running:
        yield running


@pytest.fixture(scope="module")
def api(broker: RunningBroker) -> Iterator[httpx.Client]:
    """The broker's HTTP API, as guest: to set the scene and check what the UI did."""
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest"), timeout=10) as client:
        yield client


@pytest.fixture(scope="module")
def downloads() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="tqbroker-ui-downloads-") as path:
        yield Path(path)


@pytest.fixture(scope="module")
def browser(downloads: Path) -> Iterator[WebDriver]:
    """One headless Chromium for the module (the test skips without one)."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(NO_BROWSER)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in CI containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--window-size=1400,900",
    ):
        options.add_argument(argument)
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER, port=0), options=options)
    driver.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
    )
    try:
        yield driver
    finally:
        driver.quit()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


_FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def screenshot_on_failure(request: pytest.FixtureRequest, artifacts: Path) -> Iterator[None]:
    yield
    if request.node.stash.get(_FAILED, False) and "browser" in request.fixturenames:
        driver = request.getfixturevalue("browser")
        driver.save_screenshot(str(artifacts / f"FAILED-{request.node.name}.png"))
