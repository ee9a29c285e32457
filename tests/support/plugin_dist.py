"""A third-party plugin distribution for tests: a module and its ``.dist-info`` (metadata and
entry points) written to a directory, installed by putting that directory on ``sys.path`` and
uninstalled by taking it off again (as ``pip uninstall`` would leave the broker)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

from tqbroker.plugins.loader import EXCHANGE_TYPES_GROUP, distributions


class PluginDistribution:
    """``name`` ``version`` holding the module ``module`` (``source``), whose entry points
    (``exchange type -> module:attribute``) are in the exchange-type group."""

    def __init__(
        self,
        root: Path,
        *,
        name: str,
        version: str,
        module: str,
        source: str,
        exchange_types: Mapping[str, str],
    ) -> None:
        self.root = root
        self.module = module
        root.mkdir(parents=True, exist_ok=True)
        (root / f"{module}.py").write_text(textwrap.dedent(source))
        dist_info = root / f"{name.replace('-', '_')}-{version}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        lines = "".join(f"{type_name} = {target}\n" for type_name, target in exchange_types.items())
        (dist_info / "entry_points.txt").write_text(f"[{EXCHANGE_TYPES_GROUP}]\n{lines}")

    def install(self) -> None:
        sys.path.insert(0, str(self.root))
        distributions.cache_clear()

    def uninstall(self) -> None:
        if str(self.root) in sys.path:
            sys.path.remove(str(self.root))
        sys.modules.pop(self.module, None)
        distributions.cache_clear()
