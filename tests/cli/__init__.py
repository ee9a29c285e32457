"""Tests of the admin command line (tqbroker-ctl)."""
