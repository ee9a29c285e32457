"""``broker/stats.py`` without I/O: totals add their parts up and keep a closed part's counts,
rates come from samples, ``message_stats`` and ``io_stats`` render RabbitMQ's JSON."""

from __future__ import annotations

from tqbroker.broker.stats import (
    ConnectionStats,
    Histogram,
    MessageStats,
    StatsTotal,
    io_stats,
    message_stats,
)


def test_totals_add_parts_and_keep_closed_ones() -> None:
    vhost, connection, channel = StatsTotal(), ConnectionStats(), MessageStats()
    vhost.add(connection)
    connection.add(channel)
    channel.publish += 3
    connection.recv_oct += 100
    vhost.publish += 1  # its own (e.g. the HTTP API's publishes)
    assert vhost.count("publish") == 4
    assert connection.count("recv_oct") == 100
    connection.remove(channel)
    vhost.remove(connection)
    channel.publish += 10  # after it left: not counted any more
    assert vhost.count("publish") == 4
    assert connection.count("publish") == 3
    assert connection.count("recv_oct") == 100


def test_rates_and_json() -> None:
    stats = ConnectionStats()
    stats.sample(5.0)
    stats.publish += 10
    stats.deliver += 4
    stats.get_no_ack += 1
    stats.send_oct += 50
    stats.sample(5.0)
    found = message_stats(stats)
    assert found["publish"] == 10
    assert found["publish_details"] == {"rate": 2.0}
    assert found["deliver_get"] == 5
    # Once one counter moved, every counter of the kind is shown, zeros too (as RabbitMQ does).
    assert found["ack"] == 0
    assert found["ack_details"] == {"rate": 0.0}
    assert "send_oct" not in found
    assert message_stats(ConnectionStats()) == {}  # nothing moved: no message_stats at all
    io = io_stats(stats)
    assert io["send_oct"] == 50
    assert io["send_oct_details"] == {"rate": 10.0}
    assert io["recv_oct"] == 0


def test_histogram_buckets_are_cumulative() -> None:
    histogram = Histogram((1, 10))
    for value in (0.5, 1, 5, 50):
        histogram.observe(value)
    assert histogram.cumulative() == [("1", 2), ("10", 3), ("+Inf", 4)]
    assert histogram.count == 4
    assert histogram.sum == 56.5
