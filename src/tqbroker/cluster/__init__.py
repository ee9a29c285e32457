"""A tqbroker cluster on etcd: nodes, a controller, replicated stream partitions.

``metadata.py`` is the narrow protocol over etcd everything else uses; ``etcd.py`` the client of a
real etcd (its JSON gateway, on httpx); ``peer_link.py`` the node-to-node link.
"""
