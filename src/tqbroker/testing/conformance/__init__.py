"""A conformance suite for storage backends (``tqbroker.backends.base``).

Any backend, built-in or third party, can be checked against the contract in
``tqbroker.backends.base`` from a pytest module::

    from pathlib import Path

    from tqbroker.testing.conformance import BackendConformance

    class TestMyBackend(BackendConformance):
        def make_backend(self, data_dir: Path) -> MyBackend:
            return MyBackend()

pytest then runs ``TestMyBackend::test_conformance[<case>]`` for every case in ``CASES``:
ordering, requeue, ack, purge, counts, ``peek``, ``ready_bytes``, byte-exact messages and their
``timestamp_ms`` (message TTLs count from it), priority queues built over the backend (one store
per level, as the broker builds ``x-max-priority`` queues), queue isolation, ``delete_queue``,
sharing the data directory, the flush protocol and, for a backend whose ``durable`` is true,
restarts (clean and simulated crashes: the messages, ``peek`` and ``ready_bytes`` after them);
and a Hypothesis state machine (case ``stateful``) that drives the backend side by side with the
in-memory reference backend. Cases that do not apply (durability cases on a non-durable backend,
"survives nothing" on a durable one) are skipped.

On the subclass:

- ``make_backend(data_dir)`` is the ``BackendFactory``: a callable ``(data_dir: Path) -> Backend``
  returning a fresh instance that is *not yet opened* (the suite calls ``open(data_dir)`` itself,
  and calls the factory again on the same directory to simulate a restart). Constructing an
  instance must not touch the disk: the suite builds one unopened instance per case to read
  ``durable``;
- ``known_failures = {case name: reason}`` marks those cases strict ``xfail``;
- to run one class against several backends, override the ``conformance_factory`` fixture
  instead (``@pytest.fixture(params=[...])`` returning a factory).

Without pytest: ``run_conformance(factory, directory)`` runs every applicable case; each
``check_*`` function takes ``(factory, data_dir)`` and can be called on its own; the state machine
alone is ``run_stateful(factory)`` or, as a ``unittest.TestCase``, ``stateful_test_case(factory)``.

The suite runs without Trio: backends are passive, and the flush work returned by ``begin_flush``
is a plain blocking callable, run inline by ``run_flush``. ``pop`` here pops as the broker does:
when a durable backend's ``pop`` returns ``None`` with messages ready (it must then report
``needs_flush``) it flushes and retries once, and after a pop it flushes if the store
``wants_flush``; ``peek`` here retries the same way.

Messages are compared by exchange, routing key, raw properties, body and ``timestamp_ms``. The
suite's messages always carry a non-zero timestamp, as the broker's do (it stamps every message it
accepts), so a backend may treat 0 as "not stamped".

Restarts: ``BackendHarness.restart`` closes the instance and opens a new one from the factory on
the same directory. ``BackendHarness.crash`` simulates a crash of the process (not a power loss):
it drops the instance without calling ``close`` and runs the garbage collector before opening a
new one, so a backend holding an exclusive lock must release it when collected; what reached the
page cache survives, and a backend whose finaliser closes cleanly still passes (a clean close
satisfies every crash assertion).

Needs pytest and Hypothesis (both in tqbroker's ``test`` extra).

Runtime: the state machine runs 50 examples of up to 30 steps; the environment variables
``TQBROKER_CONFORMANCE_EXAMPLES`` and ``TQBROKER_CONFORMANCE_STEPS`` raise that (nightly runs).
Failures are ``AssertionError``s carrying explicit messages, readable whether or not pytest
rewrites this package's asserts; do not run the suite under ``python -O``.
"""

from __future__ import annotations

import logging

from ...backends.base import Popped
from .cases_content import (
    check_delete_queue,
    check_large_and_empty_bodies,
    check_leaves_foreign_files_alone,
    check_messages_byte_exact,
    check_priority_levels,
    check_priority_levels_after_restart,
    check_queues_isolated,
    check_timestamps_round_trip,
)
from .cases_durability import (
    check_acked_gone_after_clean_restart,
    check_close_makes_durable,
    check_crash_keeps_flushed_persistent,
    check_crash_redelivers_popped,
    check_delete_queue_survives_restart,
    check_flush_covers_only_what_it_began_with,
    check_flush_protocol,
    check_flush_work_runs_beside_other_calls,
    check_ids_not_reused_after_restart,
    check_purge_survives_restart,
    check_ready_bytes_after_crash,
    check_ready_bytes_after_restart,
    check_redelivered_flag_after_restart,
    check_restart_keeps_nothing,
    check_restart_recovers_persistent,
    check_transient_dropped_on_restart,
)
from .cases_queue import (
    check_ack_removes,
    check_counts_track_a_mixed_workload,
    check_ids_increase,
    check_non_unacked_ids_ignored,
    check_open_creates_missing_dir,
    check_peek,
    check_pop_order,
    check_purge,
    check_ready_bytes,
    check_requeue_order,
    check_unknown_ids_ignored,
)
from .harness import (
    NEVER_ISSUED_ID,
    T0_MS,
    AppliesTo,
    BackendFactory,
    BackendHarness,
    CaseFunction,
    ConformanceCase,
    make_message,
    open_backend,
    peek,
    pop,
    run_flush,
)
from .runner import CASES, BackendConformance, run_conformance
from .stateful import (
    BackendStateMachine,
    check_stateful,
    run_stateful,
    stateful_settings,
    stateful_test_case,
)

log = logging.getLogger(__name__)

__all__ = [
    "CASES",
    "NEVER_ISSUED_ID",
    "T0_MS",
    "AppliesTo",
    "BackendConformance",
    "BackendFactory",
    "BackendHarness",
    "BackendStateMachine",
    "CaseFunction",
    "ConformanceCase",
    "Popped",
    "check_ack_removes",
    "check_acked_gone_after_clean_restart",
    "check_close_makes_durable",
    "check_counts_track_a_mixed_workload",
    "check_crash_keeps_flushed_persistent",
    "check_crash_redelivers_popped",
    "check_delete_queue",
    "check_delete_queue_survives_restart",
    "check_flush_covers_only_what_it_began_with",
    "check_flush_protocol",
    "check_flush_work_runs_beside_other_calls",
    "check_ids_increase",
    "check_ids_not_reused_after_restart",
    "check_large_and_empty_bodies",
    "check_leaves_foreign_files_alone",
    "check_messages_byte_exact",
    "check_non_unacked_ids_ignored",
    "check_open_creates_missing_dir",
    "check_peek",
    "check_pop_order",
    "check_priority_levels",
    "check_priority_levels_after_restart",
    "check_purge",
    "check_purge_survives_restart",
    "check_queues_isolated",
    "check_ready_bytes",
    "check_ready_bytes_after_crash",
    "check_ready_bytes_after_restart",
    "check_redelivered_flag_after_restart",
    "check_requeue_order",
    "check_restart_keeps_nothing",
    "check_restart_recovers_persistent",
    "check_stateful",
    "check_timestamps_round_trip",
    "check_transient_dropped_on_restart",
    "check_unknown_ids_ignored",
    "make_message",
    "open_backend",
    "peek",
    "pop",
    "run_conformance",
    "run_flush",
    "run_stateful",
    "stateful_settings",
    "stateful_test_case",
]
