"""``python -m tqbroker``: run the broker; ``python -m tqbroker ctl ...``: the admin tools (without
importing the broker's server, which they do not need); ``python -m tqbroker hash-password``:
a password hash for the config file."""

import sys

if sys.argv[1:2] == ["ctl"]:
    from .ctl import main as ctl_main

    raise SystemExit(ctl_main(sys.argv[2:], prog="python -m tqbroker ctl"))

if sys.argv[1:2] == ["hash-password"]:
    from .auth.hashcli import main as hash_main

    raise SystemExit(hash_main(sys.argv[2:]))

from .cli import main

raise SystemExit(main())
