"""The protocol package is sans-IO: nothing in it imports trio, nor the rest of tqbroker."""

from __future__ import annotations

import ast
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
        "tqbroker.protocol._events",
        "tqbroker.protocol._fastpath",
        "tqbroker.protocol._framing",
        "tqbroker.protocol._state",
        "tqbroker.protocol.codec",
        "tqbroker.protocol.connection",
        "tqbroker.protocol.errors",
        "tqbroker.protocol.frames",
        "tqbroker.protocol.methods",
        "tqbroker.protocol.properties",
    }


def test_protocol_modules_import_only_their_own_package() -> None:
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.level in (0, 1), (path, node.module)  # no ``..``
                assert node.level or not (node.module or "").startswith("tqbroker"), path
            elif isinstance(node, ast.Import):
                assert not any(alias.name.startswith("tqbroker") for alias in node.names), path


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
