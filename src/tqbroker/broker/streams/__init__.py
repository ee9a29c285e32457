"""Streams (``x-queue-type=stream``), Kafka's way: the stream queue and its readers
(``queue.py``), consumer groups (``groups.py``), topics of partitioned streams as the HTTP API and
Spark see them (``topics.py``), and what a compaction key is (``compaction.py``). The log itself
is the storage backend's (``backends.streams.StreamLog``)."""
