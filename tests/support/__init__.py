"""What the tests share (imported as ``tests.support.<module>``):

- ``polling``: ``eventually`` / ``eventually_async``, to wait for a condition instead of sleeping;
- ``brokers``: the ``make_broker`` fixture, an in-process broker with a given configuration
  (``tqbroker.testing`` has the rest: ``tqbroker_broker``, ``tqbroker_thread``,
  ``start_broker_process`` for ``python -m tqbroker`` in a child process);
- ``rawamqp``: a raw AMQP 0-9-1 client over a socket, for what no well-behaved client sends;
- ``rabbitmq_oracle``: a real RabbitMQ to compare with (the ``rabbitmq_oracle`` fixture);
- ``canary``: a pika client doing round trips while a test abuses the broker;
- ``queue_model``: the model of a classic queue and the broker it drives (reliability tests);
- ``channel_double``: a recording consumer channel, for tests that drive queues directly;
- ``plugin_dist``: a third-party plugin distribution written to a directory.
"""
