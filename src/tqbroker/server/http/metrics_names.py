"""The names, help texts and label values of the Prometheus metrics RabbitMQ's
``rabbitmq_prometheus`` plugin exports and tqbroker exports too (``metrics.py`` fills them),
copied from RabbitMQ 3.10's output.
"""

from __future__ import annotations

# RabbitMQ's queue_type label values.
QUEUE_TYPES = {"classic": "rabbit_classic_queue", "stream": "rabbit_stream_queue"}
QUORUM = "rabbit_quorum_queue"

# RabbitMQ's queue gauges: (name, help), in its order.
QUEUE_FAMILIES = (  # (name, help, a counter?)
    ("queue_messages_ready", "Messages ready to be delivered to consumers", False),
    ("queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged", False),
    ("queue_messages", "Sum of ready and unacknowledged messages - total queue depth", False),
    ("queue_consumers", "Consumers on a queue", False),
    ("queue_messages_ready_bytes", "Size in bytes of ready messages", False),
    ("queue_messages_published", "Total number of messages published to queues", True),
)
# /metrics/detailed families (RabbitMQ's names) and the queue families each has.
DETAILED_FAMILIES = {
    "queue_coarse_metrics": ("queue_messages_ready", "queue_messages_unacked", "queue_messages"),
    "queue_consumer_count": ("queue_consumers",),
    "queue_metrics": ("queue_messages_ready_bytes",),
}

# Global counters by queue type: (RabbitMQ's name, help, the counters summed).
BY_QUEUE_TYPE = (
    (
        "messages_delivered",
        "Total number of messages delivered to consumers",
        ("deliver", "deliver_no_ack", "get", "get_no_ack"),
    ),
    (
        "messages_delivered_consume_manual_ack",
        "Total number of messages delivered to consumers using basic.consume with manual "
        "acknowledgment",
        ("deliver",),
    ),
    (
        "messages_delivered_consume_auto_ack",
        "Total number of messages delivered to consumers using basic.consume with automatic "
        "acknowledgment",
        ("deliver_no_ack",),
    ),
    (
        "messages_delivered_get_manual_ack",
        "Total number of messages delivered to consumers using basic.get with manual "
        "acknowledgment",
        ("get",),
    ),
    (
        "messages_delivered_get_auto_ack",
        "Total number of messages delivered to consumers using basic.get with automatic "
        "acknowledgment",
        ("get_no_ack",),
    ),
    (
        "messages_get_empty",
        "Total number of times basic.get operations fetched no message",
        ("get_empty",),
    ),
    ("messages_redelivered", "Total number of messages redelivered to consumers", ("redeliver",)),
    ("messages_acknowledged", "Total number of messages acknowledged by consumers", ("ack",)),
)
# Channel counters summed over the open channels: (RabbitMQ's name, help, our counter).
CHANNEL_COUNTERS = (
    (
        "messages_published",
        "Total number of messages published into an exchange on a channel",
        "publish",
    ),
    (
        "messages_confirmed",
        "Total number of messages published into an exchange and confirmed on the channel",
        "confirm",
    ),
    (
        "messages_unroutable_returned",
        "Total number of messages published as mandatory into an "
        "exchange and returned to the publisher as unroutable",
        "return_unroutable",
    ),
    (
        "messages_unroutable_dropped",
        "Total number of messages published as non-mandatory into "
        "an exchange and dropped as unroutable",
        "drop_unroutable",
    ),
    ("get_empty", "Total number of times basic.get operations fetched no message", "get_empty"),
    (
        "get_ack",
        "Total number of messages fetched with basic.get in manual acknowledgement mode",
        "get",
    ),
    (
        "get",
        "Total number of messages fetched with basic.get in automatic acknowledgement mode",
        "get_no_ack",
    ),
    (
        "messages_delivered_ack",
        "Total number of messages delivered to consumers in manual acknowledgement mode",
        "deliver",
    ),
    (
        "messages_delivered",
        "Total number of messages delivered to consumers in automatic acknowledgement mode",
        "deliver_no_ack",
    ),
    ("messages_redelivered", "Total number of messages redelivered to consumers", "redeliver"),
    ("messages_acked", "Total number of messages acknowledged by consumers", "ack"),
)
CONNECTION_COUNTERS = (
    ("incoming_bytes", "Total number of bytes received on a connection", "recv_oct"),
    ("outgoing_bytes", "Total number of bytes sent on a connection", "send_oct"),
    ("incoming_packets", "Total number of packets received on a connection", "recv_cnt"),
    ("outgoing_packets", "Total number of packets sent on a connection", "send_cnt"),
)
