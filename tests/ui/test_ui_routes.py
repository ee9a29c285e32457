"""The web UI's routes, over HTTP without a browser: the page and its files come from the
package with their types and a strict Content-Security-Policy, everything the page loads is
served by the broker itself (no CDN, no outside URL), and the UI's routes shadow none of the
API's."""

from __future__ import annotations

import re
from importlib import resources

import httpx
import pytest

UI = resources.files("tqbroker.server.http.ui")


def test_the_page_needs_no_credentials_and_forbids_outside_resources(api: httpx.Client) -> None:
    anonymous = httpx.get(str(api.base_url) + "/", timeout=10)
    assert anonymous.status_code == 200
    assert anonymous.headers["content-type"] == "text/html; charset=utf-8"
    assert anonymous.content == UI.joinpath("index.html").read_bytes()
    policy = anonymous.headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert "script-src 'self'" in policy
    assert "connect-src 'self'" in policy
    assert anonymous.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    ("name", "kind"),
    [("app.js", "text/javascript"), ("pages.js", "text/javascript"), ("style.css", "text/css")],
)
def test_assets_are_the_package_files(api: httpx.Client, name: str, kind: str) -> None:
    response = api.get(f"/ui/{name}")
    assert response.status_code == 200
    assert response.headers["content-type"] == f"{kind}; charset=utf-8"
    assert response.content == UI.joinpath(name).read_bytes()


def test_everything_the_page_loads_is_served_here(api: httpx.Client) -> None:
    page = api.get("/").text
    loaded = re.findall(r'(?:src|href)="([^"#][^"]*)"', page)
    assert "ui/app.js" in loaded
    assert "ui/pages.js" in loaded
    assert "ui/style.css" in loaded
    for url in loaded:
        if url.startswith("data:"):
            continue
        assert api.get("/" + url).status_code == 200, url
    for name in ("index.html", "app.js", "pages.js", "style.css"):
        text = UI.joinpath(name).read_text()
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", text), name  # no CDN


@pytest.mark.parametrize("path", ["/ui/nope.js", "/ui/__init__.py", "/ui/", "/ui/%2E%2E%2Fapp.py"])
def test_other_files_are_not_served(api: httpx.Client, path: str) -> None:
    response = api.get(path)
    assert response.status_code == 404
    assert "import" not in response.text  # not the module's source


def test_the_api_is_not_shadowed(api: httpx.Client) -> None:
    assert api.get("/api/overview").json()["product_name"] == "tqbroker"
    assert api.get("/health").json()["status"] == "ok"
    assert api.get("/api/queues/%2F").status_code == 200
    assert api.get("/topics/none/offsets").status_code == 404  # the topic API's own answer
