"""The ``pki`` fixture: one trustme PKI (files) for the TLS tests of a session."""

from __future__ import annotations

import pytest

from .harness import Pki, make_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))
