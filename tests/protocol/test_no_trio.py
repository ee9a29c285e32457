"""The protocol package is sans-IO: nothing in it imports trio."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import tqbroker.protocol

PACKAGE_DIR = Path(tqbroker.protocol.__file__).resolve().parent
TQBROKER_DIR = PACKAGE_DIR.parent
MODULES = sorted(
    f"tqbroker.protocol.{info.name}" for info in pkgutil.iter_modules([str(PACKAGE_DIR)])
)

# Imports the given modules in a fresh interpreter and prints the trio modules loaded. With
# --isolated, ``tqbroker`` itself is stood in by a bare package object, so only what the protocol
# package imports counts (not what ``tqbroker/__init__.py`` pulls in).
PROBE = """
import importlib, json, sys, types
isolated, tqbroker_dir, modules = json.loads(sys.argv[1])
if isolated:
    package = types.ModuleType("tqbroker")
    package.__path__ = [tqbroker_dir]
    sys.modules["tqbroker"] = package
for name in modules:
    importlib.import_module(name)
loaded = [name for name in sys.modules if name == "trio" or name.startswith("trio.")]
print(json.dumps(sorted(loaded)))
"""


def trio_modules_after_import(*, isolated: bool) -> list[str]:
    argument = json.dumps([isolated, str(TQBROKER_DIR), ["tqbroker.protocol", *MODULES]])
    result = subprocess.run(
        [sys.executable, "-c", PROBE, argument],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    loaded: list[str] = json.loads(result.stdout)
    return loaded


def test_the_package_has_the_expected_modules() -> None:
    assert set(MODULES) >= {
        "tqbroker.protocol.codec",
        "tqbroker.protocol.connection",
        "tqbroker.protocol.errors",
        "tqbroker.protocol.frames",
        "tqbroker.protocol.methods",
    }


def test_protocol_modules_do_not_import_trio() -> None:
    assert trio_modules_after_import(isolated=True) == []


def test_importing_tqbroker_protocol_does_not_import_trio() -> None:
    assert trio_modules_after_import(isolated=False) == []


def test_no_protocol_source_mentions_import_trio() -> None:
    sources = sorted(PACKAGE_DIR.rglob("*.py"))
    assert sources
    for path in sources:
        text = path.read_text()
        assert "import trio" not in text, path
        assert "from trio" not in text, path
