"""The exchange types every AMQP broker has: direct, fanout, topic, headers."""
