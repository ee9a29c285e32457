"""Fuzzing of everything that parses untrusted bytes (see ``run.py`` and ``test_fuzz.py``)."""
