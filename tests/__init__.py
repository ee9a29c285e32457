"""tqbroker's test suite (a package, so that helpers are imported as ``tests.support...`` and
test modules of the same name in two directories do not clash). See tests/README.md."""
