"""Kafka's wire protocol, sans-IO: the codec the Kafka listener is a thin layer over.

- ``wire``: the primitive types (fixed-width integers, varints, compact and classic strings,
  bytes and arrays);
- ``messages``: a message of one version by its schema, decoded to a dict and encoded from one;
- ``schemas``: the schemas, generated from Kafka's JSON message schemas (``tools/gen_kafka.py``);
- ``requests``: a request's header and body, a response with its header and size.
"""
