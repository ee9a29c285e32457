"""``python -m tqbroker``: run the broker."""

from .cli import main

raise SystemExit(main())
