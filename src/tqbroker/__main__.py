"""``python -m tqbroker``: run the broker; ``python -m tqbroker ctl ...``: the admin tools (without
importing the broker's server, which they do not need)."""

import sys

if sys.argv[1:2] == ["ctl"]:
    from .ctl import main as ctl_main

    raise SystemExit(ctl_main(sys.argv[2:], prog="python -m tqbroker ctl"))

from .cli import main

raise SystemExit(main())
