"""The curated mutants of ``tools/mutants.py``: one-line (or one-statement) breakages of the
storage, flusher, settlement, dead-lettering, auth, stream-offset, routing, cross-site, accept
loop, data-directory lock and field-table timestamp code, each with the tests that must catch
it. The first of each area are the breakages issue 14 (item 10) found the suite blind to.
``survives`` marks a known survivor and says why it is tolerated. ``tests/mutation/
test_mutant_list.py`` (the default suite) checks each snippet is still found exactly once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """In ``path`` (relative to ``src/tqbroker``) the snippet ``original`` (found exactly once)
    becomes ``replacement``; ``tests`` (pytest arguments) must fail on it. ``survives``: why a
    known survivor is tolerated; None: it must be killed."""

    id: str
    area: str
    path: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    survives: str | None = None


# Test selections, the most pointed first (pytest runs with -x: a kill stops at once).
LOG_STORE = (
    "tests/storage/test_log_guards.py",
    "tests/backends/test_log_store.py",
    "tests/storage/test_log_recovery.py",
    "tests/storage/test_log_corruption.py",
    "tests/storage/test_group_commit.py",
    "tests/storage/test_log_policies.py",
    "tests/backends/test_log_conformance.py",
    "tests/storage/test_durability.py",
)
STREAMS = (
    "tests/broker/test_stream_queue.py",
    "tests/storage/test_restart_guards.py",
    "tests/storage/test_stream_durable_reads.py",
    "tests/interop/test_streams.py",
    "tests/interop/test_stream_group_commits.py",
    "tests/broker/test_consumer_groups.py",
    "tests/interop/test_stream_groups.py",
    "tests/http/test_bulk_records.py",
)
FLUSHES = (
    "tests/storage/test_confirm_waits_for_fsync.py",
    "tests/storage/test_flush_failures.py",
    "tests/http/test_http_guards.py",
    "tests/storage/test_group_commit.py",
    "tests/storage/test_stream_durable_reads.py",
)
SETTLEMENT = (
    "tests/broker/test_settlement_guards.py",
    "tests/broker/test_queue_semantics.py",
    "tests/interop/test_pika_blocking.py",
    "tests/interop/test_aio_pika.py",
    "tests/interop/test_queue_features.py",
)
_DEAD_LETTER_FIELDS = "tests/interop/test_dead_letter_fields.py::"  # not its oracle tests
X_DEATH_FIELDS = (
    _DEAD_LETTER_FIELDS + "test_x_death_names_the_exchange_the_message_was_published_to"
)
DROP_HEAD = _DEAD_LETTER_FIELDS + "test_drop_head_drops_every_head_a_publish_needs"
DEAD_LETTERS = (
    "tests/broker/test_settlement_guards.py",
    "tests/broker/test_queue_semantics.py",
    "tests/interop/test_queue_features.py",
    X_DEATH_FIELDS,
    DROP_HEAD,
)
HTTP_AUTH = (
    "tests/http/test_http_guards.py",
    "tests/http/test_topics_api.py",
    "tests/http/test_bulk_records.py",
)
LOGINS = (
    "tests/auth/test_login_flood_one_address.py",
    "tests/auth/test_auth_model.py",
    "tests/auth/test_logins.py",
)
CROSS_SITE = (
    "tests/http/test_cross_site.py",
    "tests/ui/test_cross_site_page.py",
    "tests/http/test_definitions_api.py",
)
DEFINITIONS_ADMIN = (
    "tests/http/test_definitions_api.py",
    "tests/http/test_http_authorization.py",
    "tests/auth/test_runtime_api.py",
)
PARTITION = (
    "tests/broker/test_partition.py",
    "tests/storage/test_stream_durable_reads.py",
    *STREAMS,
)
ROUTING = (
    "tests/broker/test_publish.py",
    "tests/interop/test_routing_extras.py",
    "tests/interop/test_pika_blocking.py",
)
DATA_DIR_LOCK = ("tests/server/test_data_dir_lock.py",)
CLUSTER = ("tests/cluster/test_cluster_core.py", "tests/cluster/test_cluster_faults.py")
CLUSTER_GROUPS = ("tests/cluster/test_cluster_group_assignment.py",)
TIMESTAMPS = ("tests/protocol/test_timestamps.py", "tests/protocol/test_codec.py")
ACCEPTING = ("tests/server/test_accept_exhausted.py", "tests/storage/test_out_of_descriptors.py")
_BAD_INPUT = "tests/interop/test_bad_input.py::"
AMQP_AUTH = (
    _BAD_INPUT + "test_r04_wrong_credentials_with_capability_get_403",
    _BAD_INPUT + "test_r04_wrong_credentials_without_capability_close_tcp",
    _BAD_INPUT + "test_r05_guest_from_non_loopback_is_refused",
    _BAD_INPUT + "test_r10_open_vhost_without_permission",
)


def mutants() -> list[Mutant]:
    return [
        # -- dead-lettering (broker/deadletter.py) -------------------------------------------
        Mutant(
            "deadletter-same-death-queue-only",
            "deadletter",
            "broker/deadletter.py",
            'return death.get("queue") == queue and death.get("reason") == reason',
            'return death.get("queue") == queue',
            DEAD_LETTERS,
        ),
        Mutant(
            "deadletter-count-not-incremented",
            "deadletter",
            "broker/deadletter.py",
            '"count": (count if isinstance(count, int) else 0) + 1}',
            '"count": (count if isinstance(count, int) else 0)}',
            DEAD_LETTERS,
        ),
        Mutant(
            "deadletter-rejection-does-not-break-cycle",
            "deadletter",
            "broker/deadletter.py",
            'if death.get("reason") == "rejected":\n            return False',
            'if death.get("reason") == "never":\n            return False',
            DEAD_LETTERS,
        ),
        Mutant(
            "deadletter-no-cycle-detection",
            "deadletter",
            "broker/deadletter.py",
            'if death.get("queue") == target_queue:\n            return True',
            'if death.get("queue") == target_queue:\n            return False',
            DEAD_LETTERS,
        ),
        Mutant(
            "deadletter-expiration-kept",
            "deadletter",
            "broker/deadletter.py",
            "attrs.evolve(properties, headers=headers, expiration=None)",
            "attrs.evolve(properties, headers=headers)",
            DEAD_LETTERS,
        ),
        Mutant(
            "deadletter-first-death-overwritten",
            "deadletter",
            "broker/deadletter.py",
            'headers.setdefault(f"x-first-death-{key}", value)',
            'headers[f"x-first-death-{key}"] = value',
            DEAD_LETTERS,
        ),
        Mutant(
            "deadletter-x-death-names-the-dead-letter-exchange",
            "deadletter",
            "broker/deadletter.py",
            '"exchange": message.exchange,',
            '"exchange": exchange,',
            (X_DEATH_FIELDS, *DEAD_LETTERS),
        ),
        Mutant(
            "drop-head-drops-one-head-per-publish",
            "deadletter",
            "broker/classic.py",
            'self._discard(entry[0], entry[1], "maxlen")',
            'self._discard(entry[0], entry[1], "maxlen")\n            break',
            (DROP_HEAD, *DEAD_LETTERS),
        ),
        Mutant(
            "deadletter-cc-kept-with-routing-key",
            "deadletter",
            "broker/deadletter.py",
            'headers.pop("CC", None)',
            "pass",
            DEAD_LETTERS,
        ),
        # -- settlement (broker/classic.py, server/deliveries.py, server/confirms.py) --------
        Mutant(
            "classic-requeue-keeps-prefetch-credit",
            "settlement",
            "broker/classic.py",
            "            consumer.unacked -= 1\n"
            "            self.candidates.credit_returned(consumer)\n"
            "        self.wake()\n        if self.delivery_limit is not None:",
            "            self.candidates.credit_returned(consumer)\n"
            "        self.wake()\n        if self.delivery_limit is not None:",
            SETTLEMENT,
        ),
        Mutant(
            "classic-ack-keeps-prefetch-credit",
            "settlement",
            "broker/classic.py",
            "            consumer.unacked -= 1\n"
            "            self.candidates.credit_returned(consumer)\n"
            "            self.wake()\n\n    def ack_many",
            "            self.candidates.credit_returned(consumer)\n"
            "            self.wake()\n\n    def ack_many",
            SETTLEMENT,
        ),
        Mutant(
            "classic-reject-not-dead-lettered",
            "settlement",
            "broker/classic.py",
            "if message is not None and not self.deleted:\n            self._discard_new(message,"
            ' "rejected")',
            'if False:\n            self._discard_new(message, "rejected")',
            DEAD_LETTERS,
        ),
        Mutant(
            "deliveries-multiple-ack-stops-before-tag",
            "settlement",
            "server/deliveries.py",
            "if t > tag:",
            "if t >= tag:",
            SETTLEMENT,
        ),
        Mutant(
            "deliveries-requeue-settles-as-ack",
            "settlement",
            "server/deliveries.py",
            "elif settlement is _REQUEUE:\n            self.queue.requeue(",
            "elif settlement is _REQUEUE:\n            self.queue.ack(",
            SETTLEMENT,
        ),
        Mutant(
            "deliveries-reject-requeues",
            "settlement",
            "server/deliveries.py",
            "return _REQUEUE if requeue else _REJECT",
            "return _REQUEUE",
            SETTLEMENT,
        ),
        Mutant(
            "deliveries-take-all-keeps-them",
            "settlement",
            "server/deliveries.py",
            "taken = list(self.unacked.items())\n        self.unacked.clear()",
            "taken = list(self.unacked.items())",
            SETTLEMENT,
        ),
        Mutant(
            "confirms-ack-before-the-flush",
            "settlement",
            "server/confirms.py",
            "elif not all(flusher.completed >= ticket for flusher, ticket in head.waits):",
            "elif False:",
            FLUSHES,
        ),
        Mutant(
            "confirms-nack-sent-as-ack",
            "settlement",
            "server/confirms.py",
            "self._send(BasicNack(head.seq, head.seq > head.first, False))",
            "self._send(BasicAck(head.seq, head.seq > head.first))",
            FLUSHES,
        ),
        Mutant(
            "confirms-failed-flush-spares-its-last-ticket",
            "settlement",
            "server/confirms.py",
            "flusher.completed < t <= upto",
            "flusher.completed < t < upto",
            FLUSHES,
        ),
        Mutant(
            "confirms-never-multiple",
            "settlement",
            "server/confirms.py",
            "self._send(BasicAck(seq, seq - self.confirmed > 1))",
            "self._send(BasicAck(seq, False))",
            (*SETTLEMENT, "tests/storage/test_flush_failures.py"),
        ),
        # -- the flusher (broker/flusher.py) and what waits on it ----------------------------
        Mutant(
            "flusher-completes-before-the-fsync",
            "flusher",
            "broker/flusher.py",
            "            covering = self.requested\n",
            "            covering = self.requested\n            self.completed = covering\n",
            FLUSHES,
        ),
        Mutant(
            "flusher-failure-spares-later-tickets",
            "flusher",
            "broker/flusher.py",
            "failed = self.requested",
            "failed = covering",
            FLUSHES,
        ),
        Mutant(
            "flusher-never-polls-the-backend",
            "flusher",
            "broker/flusher.py",
            "if not self._wakeup.is_set() and not self.backend.needs_flush:",
            "if not self._wakeup.is_set():",
            (*STREAMS, *FLUSHES),
        ),
        Mutant(
            "flusher-waiter-ignores-failure",
            "flusher",
            "broker/flusher.py",
            "            self.ok = False\n",
            "            self.ok = True\n",
            FLUSHES,
        ),
        Mutant(
            "topics-produce-ignores-a-failed-flush",
            "flusher",
            "broker/streams/topics.py",
            "if not await durability.wait():",
            "if not await durability.wait() and False:",
            (*FLUSHES, *HTTP_AUTH),
        ),
        Mutant(
            "health-ignores-the-backends",
            "flusher",
            "server/http/health_routes.py",
            "for f in broker.flushers.values() if not f.backend.healthy)",
            "for f in broker.flushers.values() if False)",
            (*HTTP_AUTH, *FLUSHES),
        ),
        # -- storage: the log backend (backends/log/*, storage_env/) ----------------------------
        Mutant(
            "log-failed-fdatasync-not-final",
            "storage",
            "backends/log/log.py",
            "over lost data. The log stops taking durable writes.\n"
            "                self.sync_failed = True",
            "over lost data. The log stops taking durable writes.\n"
            "                self.sync_failed = False",
            (*FLUSHES, *LOG_STORE),
        ),
        Mutant(
            "backend-forgets-a-failed-fdatasync",
            "storage",
            "backends/log/__init__.py",
            "if self._sync_failed or any(store.log.sync_failed for store in stores):",
            "if False:",
            (*FLUSHES, *LOG_STORE),
        ),
        Mutant(
            "segment-no-fdatasync",
            "storage",
            "backends/log/segment.py",
            "self.file.fdatasync()",
            "pass",
            ("tests/storage/test_group_commit.py", *LOG_STORE, *FLUSHES),
        ),
        Mutant(
            "atomic-write-no-fsync",
            "storage",
            "storage_env/__init__.py",
            "fs.write_file(tmp, data, fsync=fsync)",
            "fs.write_file(tmp, data, fsync=False)",
            ("tests/powercut/test_powercut.py", *LOG_STORE),
        ),
        Mutant(
            "log-new-queue-directory-entry-never-synced",
            "storage",
            "backends/log/__init__.py",
            "                self._unsynced_dirs.add(self.root)",
            "                pass",
            ("tests/powercut/test_new_queues.py", "tests/powercut/test_regressions.py"),
        ),
        Mutant(
            "store-new-queue-records-without-checkpoint-not-redelivered",
            "storage",
            "backends/log/store.py",
            "if state_lost or not (state or self.log.created):",
            "if state_lost:",
            ("tests/powercut/test_new_queues.py",),
        ),
        Mutant(
            "store-ack-never-settles",
            "storage",
            "backends/log/store.py",
            "if self._unacked.pop(message_id, None) is not None:\n"
            "            self._settle(message_id)",
            "self._unacked.pop(message_id, None)",
            LOG_STORE,
        ),
        Mutant(
            "store-requeue-loses-the-message",
            "storage",
            "backends/log/store.py",
            "heapq.heappush(self._requeued, (message_id, size))",
            "pass",
            LOG_STORE,
        ),
        Mutant(
            "store-no-redelivered-flag-after-restart",
            "storage",
            "backends/log/store.py",
            "        self._unacked[offset] = size\n"
            "        return offset, record.message, requeued or offset < self.redelivered_below",
            "        self._unacked[offset] = size\n        return offset, record.message, requeued",
            LOG_STORE,
        ),
        Mutant(
            "store-delivers-past-the-reservation",
            "storage",
            "backends/log/store.py",
            "if offset >= self.delivered_reserved:\n                self._request_reservation(",
            "if False:\n                self._request_reservation(",
            (*LOG_STORE, "tests/storage/test_flush_failures.py"),
        ),
        Mutant(
            "rangeset-adjacent-ranges-not-merged",
            "storage",
            "backends/log/ranges.py",
            "i = bisect_left(self.ends, start)",
            "i = bisect_right(self.ends, start)",
            LOG_STORE,
        ),
        Mutant(
            "store-checkpoint-without-settled",
            "storage",
            "backends/log/store.py",
            '"settled": self.settled.as_list(),',
            '"settled": [],',
            LOG_STORE,
        ),
        Mutant(
            "recovery-torn-tail-not-truncated",
            "storage",
            "backends/log/recovery.py",
            "cut = not intact and truncate",
            "cut = False",
            LOG_STORE,
        ),
        Mutant(
            "recovery-tail-not-walked",
            "storage",
            "backends/log/recovery.py",
            "        and _indexes_agree(segment)\n        and _tail_consistent(segment)\n",
            "        and _indexes_agree(segment)\n",
            LOG_STORE,
        ),
        Mutant(
            "recovery-accepts-offsets-going-back",
            "storage",
            "backends/log/recovery.py",
            "if frame.offset < expected:\n                raise RecordError(",
            "if False:\n                raise RecordError(",
            LOG_STORE,
        ),
        Mutant(
            "log-trusts-unsynced-segments",
            "storage",
            "backends/log/recovery.py",
            "if clean or (next_base is not None and next_base < recovery_point):",
            "if True:",
            LOG_STORE,
        ),
        Mutant(
            "retention-deletes-a-segment-exactly-max-age-old",
            "storage",
            "backends/log/log.py",
            "oldest.max_timestamp < now_ms - max_age_ms",
            "oldest.max_timestamp <= now_ms - max_age_ms",
            ("tests/storage/test_log_policies.py", "tests/broker/test_stream_queue.py"),
        ),
        Mutant(
            "stream-durable-end-before-the-fsync",
            "storage",
            "backends/log/stream.py",
            "        if not fsync:\n            self._durable_end = written",
            "        if True:\n            self._durable_end = written",
            STREAMS,
        ),
        Mutant(
            "stream-producers-never-persisted",
            "storage",
            "backends/log/streamstate.py",
            "for name, state in self.producers.items()",
            "for name, state in {}.items()",
            STREAMS,
        ),
        Mutant(
            "stream-offsets-persisted-only-at-shutdown",
            "storage",
            "backends/log/stream.py",
            "due=self._offsets_dirty, checkpoint=",
            "due=False, checkpoint=",
            STREAMS,
        ),
        # -- stream offsets (broker/streams/*) ------------------------------------------------
        Mutant(
            "stream-reads-past-the-durable-end",
            "streams",
            "broker/streams/queue.py",
            "end = partition.high_watermark\n        position = max(position, partition.log_start",
            "end = partition.log_end_offset\n        position = max(position, partition.log_start",
            STREAMS,
        ),
        Mutant(
            "stream-tracked-offset-not-resumed",
            "streams",
            "broker/streams/queue.py",
            "if stored is not None:  # it consumed before",
            "if False:  # it consumed before",
            STREAMS,
        ),
        Mutant(
            "stream-tracked-offset-stores-the-acked-one",
            "streams",
            "broker/streams/queue.py",
            "max(stored, max(message_ids) + 1)",
            "max(stored, max(message_ids))",
            STREAMS,
        ),
        Mutant(
            "stream-group-commits-past-unacked",
            "streams",
            "broker/streams/cursor.py",
            "return self.delivered[0] if self.delivered else self.position",
            "return self.position",
            STREAMS,
        ),
        Mutant(
            "stream-group-requeue-not-rewound",
            "streams",
            "broker/streams/cursor.py",
            "self.position = min(self.position, offset)",
            "pass",
            STREAMS,
        ),
        Mutant(
            "stream-last-is-the-end",
            "streams",
            "broker/streams/queue.py",
            "return max(first, end - 1)",
            "return end",
            STREAMS,
        ),
        Mutant(
            "stream-requeue-keeps-prefetch-credit",
            "streams",
            "broker/streams/queue.py",
            "        consumer.unacked -= len(message_ids)\n        self._wakeup.set()\n",
            "        if not requeue:\n            consumer.unacked -= len(message_ids)\n"
            "        self._wakeup.set()\n",
            (*SETTLEMENT, *STREAMS),
        ),
        Mutant(
            "partition-high-watermark-is-the-log-end",
            "streams",
            "broker/streams/partition.py",
            "        durable_end = self._log.durable_end\n        return durable_end if gate",
            "        durable_end = self._log.next_offset\n        return durable_end if gate",
            PARTITION,
        ),
        Mutant(
            "partition-reads-past-the-high-watermark",
            "streams",
            "broker/streams/partition.py",
            "if record is None or record.offset >= self.high_watermark:",
            "if record is None:",
            PARTITION,
        ),
        Mutant(
            "topics-idempotent-producer-never-skips",
            "streams",
            "broker/streams/topics.py",
            "skip = min(len(records), expected - producer[1])",
            "skip = 0",
            STREAMS,
        ),
        # -- auth (auth/*, server/http/auth.py, server/handshake.py) -----------------------------
        Mutant(
            "http-no-vhost-permission-check",
            "auth",
            "server/http/auth.py",
            "if not await broker.authenticator.chain.check_vhost(user, name, peer_of(request)):",
            "if False:",
            HTTP_AUTH,
        ),
        Mutant(
            "http-loopback-only-user-from-anywhere",
            "auth",
            "server/http/auth.py",
            'return Peer(request.client.host if request.client else "")',
            'return Peer("127.0.0.1")',
            HTTP_AUTH,
        ),
        Mutant(
            "amqp-loopback-only-user-from-anywhere",
            "auth",
            "server/handshake.py",
            "peer = Peer(self._peer_host, None, self.peer_username)\n        try:",
            'peer = Peer("127.0.0.1", None, self.peer_username)\n        try:',
            AMQP_AUTH,
        ),
        Mutant(
            "user-may-open-every-vhost",
            "auth",
            "auth/internal.py",
            "return (user.name, vhost) in self.db.permissions",
            "return True",
            (*HTTP_AUTH, *AMQP_AUTH),
        ),
        Mutant(
            "is-loopback-always",
            "auth",
            "auth/authenticator.py",
            "return address.is_loopback",
            "return True",
            (*HTTP_AUTH, *AMQP_AUTH),
        ),
        Mutant(
            "credential-cache-ignores-the-password",
            "auth",
            "auth/authenticator.py",
            'self._digest(f"{username}\\0{password}")',
            'self._digest(f"{username}\\0")',
            (*HTTP_AUTH, *AMQP_AUTH),
        ),
        Mutant(
            "plain-response-any-password",
            "auth",
            "auth/passwords.py",
            "return hmac.compare_digest(_digest(algorithm, salt + password.encode()), expected)",
            "return True",
            (*HTTP_AUTH, *AMQP_AUTH),
        ),
        Mutant(
            "login-allowance-keyed-by-address-only",
            "auth",
            "auth/authenticator.py",
            'return self._digest(f"{peer.host}\\0{username}")',
            "return self._digest(peer.host)",
            LOGINS,
        ),
        Mutant(
            "login-allowance-refuses-a-cached-success",
            "auth",
            "auth/authenticator.py",
            "if user is None:  # not a recent success: the allowance applies",
            "if True:  # not a recent success: the allowance applies",
            LOGINS,
        ),
        Mutant(
            "login-allowance-never-spent",
            "auth",
            "auth/authenticator.py",
            "if not self.buckets.allows(source):",
            "if False:",
            LOGINS,
        ),
        Mutant(
            "login-backend-outage-spends-the-allowance",
            "auth",
            "auth/authenticator.py",
            "await self._refuse(username, BACKEND_UNAVAILABLE, peer, source, count=False)",
            "await self._refuse(username, BACKEND_UNAVAILABLE, peer, source, count=True)",
            LOGINS,
        ),
        Mutant(
            "definitions-export-for-any-user",
            "auth",
            "server/http/definitions_routes.py",
            "    await _authorised(request)\n    broker = broker_of(request)\n"
            "    if vhost is not None and vhost not in broker.vhosts:\n        raise ApiError(400",
            "    broker = broker_of(request)\n"
            "    if vhost is not None and vhost not in broker.vhosts:\n        raise ApiError(400",
            DEFINITIONS_ADMIN,
        ),
        Mutant(
            "definitions-import-for-any-user",
            "auth",
            "server/http/definitions_routes.py",
            "    await _authorised(request)\n    broker = broker_of(request)\n"
            "    if vhost is not None and vhost not in broker.vhosts:\n        raise ApiError(404",
            "    broker = broker_of(request)\n"
            "    if vhost is not None and vhost not in broker.vhosts:\n        raise ApiError(404",
            DEFINITIONS_ADMIN,
        ),
        # -- cross-site requests (server/http/cross_site.py) -----------------------------------
        Mutant(
            "cross-site-origin-unchecked",
            "http",
            "server/http/cross_site.py",
            "if origin is None:\n        return True",
            "if True:\n        return True",
            CROSS_SITE,
        ),
        Mutant(
            "cross-site-sec-fetch-site-ignored",
            "http",
            "server/http/cross_site.py",
            "if site is not None:\n        return site.lower() in SAME_ORIGIN",
            "if False:\n        return site.lower() in SAME_ORIGIN",
            CROSS_SITE,
        ),
        Mutant(
            "cross-site-same-site-port-taken-as-same-origin",
            "http",
            "server/http/cross_site.py",
            "same = (sent.hostname, _port(sent)) == (own.hostname, _port(own))",
            "same = sent.hostname == own.hostname",
            CROSS_SITE,
        ),
        Mutant(
            "cross-site-api-content-type-unchecked",
            "http",
            "server/http/cross_site.py",
            'if api and kind != JSON_TYPE and (kind or method == "POST"):',
            "if False:",
            CROSS_SITE,
        ),
        Mutant(
            "cross-site-topic-form-body-taken",
            "http",
            "server/http/cross_site.py",
            "if not api and kind in FORM_TYPES:",
            "if False:",
            CROSS_SITE,
        ),
        # -- publishing (broker/routing.py) ----------------------------------------------------
        Mutant(
            "routing-mandatory-never-returned",
            "routing",
            "broker/routing.py",
            "            stats.return_unroutable += 1\n"
            "            return waits, refused, message, destinations",
            "            stats.return_unroutable += 1\n"
            "            return waits, refused, None, destinations",
            ROUTING,
        ),
        Mutant(
            "routing-cc-keys-ignored",
            "routing",
            "broker/routing.py",
            "exchange, message.routing_keys(bcc=True), message.properties",
            "exchange, [message.routing_key], message.properties",
            ROUTING,
        ),
        Mutant(
            "routing-bcc-delivered",
            "routing",
            "broker/routing.py",
            'message = message.with_headers({k: v for k, v in headers.items() if k != "BCC"})',
            "pass",
            ROUTING,
        ),
        # -- the data-directory lock (dirlock.py) ----------------------------------------------
        Mutant(
            "dirlock-not-taken",
            "server",
            "dirlock.py",
            "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
            "pass",
            DATA_DIR_LOCK,
        ),
        Mutant(
            "dirlock-pid-not-written",
            "server",
            "dirlock.py",
            'os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)',
            "pass",
            DATA_DIR_LOCK,
        ),
        Mutant(
            "dirlock-release-leaves-the-pid",
            "server",
            "dirlock.py",
            "os.ftruncate(fd, 0)\n        except OSError:\n            pass  # the lock goes",
            "pass\n        except OSError:\n            pass  # the lock goes",
            DATA_DIR_LOCK,
        ),
        # -- the accept loop (server/accepting.py) ---------------------------------------------
        Mutant(
            "accept-exhausted-warns-every-failure",
            "server",
            "server/accepting.py",
            "if now - self._warned_at < WARN_EVERY_S:",
            "if False:",
            ACCEPTING,
        ),
        Mutant(
            "accept-exhausted-left-out-not-counted",
            "server",
            "server/accepting.py",
            "            self.left_out += 1\n",
            "            pass\n",
            ACCEPTING,
        ),
        Mutant(
            "accept-exhausted-retries-without-a-pause",
            "server",
            "server/accepting.py",
            "await trio.sleep(RETRY_S)",
            "await trio.sleep(0)",
            ACCEPTING,
        ),
        # -- field-table timestamps (protocol/codec.py) ----------------------------------------
        Mutant(
            "timestamp-past-9999-read-as-datetime",
            "protocol",
            "protocol/codec.py",
            "if 0 <= seconds <= _LAST_DATETIME:",
            "if 0 <= seconds:",
            TIMESTAMPS,
        ),
        Mutant(
            "timestamp-last-datetime-second-off-by-one",
            "protocol",
            "protocol/codec.py",
            "(_LAST_DAY - _EPOCH).days * 86400 + 86399",
            "(_LAST_DAY - _EPOCH).days * 86400 + 86398",
            TIMESTAMPS,
        ),
        Mutant(
            "timestamp-beyond-datetime-written-as-another",
            "protocol",
            "protocol/codec.py",
            'out += b"T" + U64.pack(value.seconds)',
            'out += b"T" + U64.pack(value.seconds & 0xFFFFFFFF)',
            TIMESTAMPS,
        ),
        # -- the cluster (cluster/) ---------------------------------------------------------
        Mutant(
            "catalog-forgets-what-it-agreed",
            "cluster",
            "cluster/catalog.py",
            "self.base: dict[str, bytes] = self._load_base()",
            "self.base: dict[str, bytes] = {}",
            CLUSTER,
        ),
        Mutant(
            "forwarded-refusal-confirmed",
            "cluster",
            "cluster/forwarding.py",
            "self.commit.answered(start + taken, start + len(batch))",
            "self.commit.answered(start + len(batch), start + len(batch))",
            CLUSTER,
        ),
        Mutant(
            "preferred-election-to-an-ineligible-replica",
            "cluster",
            "cluster/placement.py",
            "    if not eligible(record, preferred, live, reports):\n        return None\n",
            "",
            ("tests/cluster/test_placement.py",),
        ),
        Mutant(
            "stale-group-commit-taken",
            "cluster",
            "cluster/groups.py",
            "assignment.generation > fence.generation",
            "assignment.generation < fence.generation",
            CLUSTER_GROUPS,
        ),
        Mutant(
            "group-assignment-keeps-its-generation",
            "cluster",
            "cluster/groups.py",
            "generation = found[0].generation + 1 if found is not None else 1",
            "generation = found[0].generation if found is not None else 1",
            CLUSTER_GROUPS,
        ),
    ]
