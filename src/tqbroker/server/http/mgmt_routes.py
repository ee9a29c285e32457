"""The route table of the RabbitMQ-compatible management API (``/api/...``); the alarm health
checks are in ``health_routes.py``, definitions in their own module."""

from __future__ import annotations

from starlette.routing import Route

from . import mgmt_bindings as bindings
from . import mgmt_connections as connections
from . import mgmt_exchanges as exchanges
from . import mgmt_overview as overview
from . import mgmt_queues as queues
from . import mgmt_user_writes as user_writes
from . import mgmt_users as users
from . import mgmt_vhosts as vhosts

_BINDING = "/api/bindings/{vhost}/e/{source}/{kind}/{destination}"
_QUEUE = "/api/queues/{vhost}/{name}"
_EXCHANGE = "/api/exchanges/{vhost}/{name}"
_PERMISSIONS = "/api/permissions/{vhost}/{user}"
_TOPIC_PERMISSIONS = "/api/topic-permissions/{vhost}/{user}"

MANAGEMENT_ROUTES = [
    # Features tqbroker does not have: none defined, as RabbitMQ lists them then.
    *(
        Route(path, overview.empty_list)
        for path in (
            "/api/extensions",
            "/api/policies",
            "/api/policies/{vhost}",
            "/api/operator-policies",
        )
    ),
    Route("/api/overview", overview.overview),
    Route("/api/whoami", overview.whoami),
    Route("/api/cluster-name", overview.cluster_name),
    Route("/api/nodes", overview.nodes),
    Route("/api/nodes/{name}", overview.node),
    Route("/api/vhosts", overview.vhosts),
    Route("/api/vhosts/{vhost}", overview.vhost, methods=["GET"]),
    Route("/api/vhosts/{vhost}", vhosts.put_vhost, methods=["PUT"]),
    Route("/api/vhosts/{vhost}", vhosts.delete_vhost, methods=["DELETE"]),
    Route("/api/parameters", vhosts.parameters),
    Route("/api/parameters/{component}", vhosts.parameters),
    Route("/api/parameters/{component}/{vhost}", vhosts.parameters),
    Route("/api/vhost-limits", vhosts.vhost_limits),
    Route("/api/vhost-limits/{vhost}", vhosts.vhost_limits),
    Route("/api/vhost-limits/{vhost}/{name}", vhosts.put_vhost_limit, methods=["PUT"]),
    Route("/api/vhost-limits/{vhost}/{name}", vhosts.delete_vhost_limit, methods=["DELETE"]),
    Route("/api/user-limits", vhosts.user_limits),
    Route("/api/user-limits/{user}", vhosts.user_limits),
    Route("/api/user-limits/{user}/{name}", vhosts.put_user_limit, methods=["PUT"]),
    Route("/api/user-limits/{user}/{name}", vhosts.delete_user_limit, methods=["DELETE"]),
    Route("/api/vhosts/{vhost}/connections", connections.list_connections),
    Route("/api/vhosts/{vhost}/channels", connections.list_channels),
    Route("/api/vhosts/{vhost}/permissions", users.vhost_permissions),
    Route("/api/vhosts/{vhost}/topic-permissions", users.vhost_topic_permissions),
    Route("/api/topic-permissions", users.topic_permissions),
    Route("/api/users/{name}/topic-permissions", users.user_topic_permissions),
    Route("/api/users", users.users),
    Route("/api/users/without-permissions", users.users_without_permissions),
    Route("/api/users/bulk-delete", user_writes.bulk_delete_users, methods=["POST"]),
    Route("/api/users/{name}", users.user, methods=["GET"]),
    Route("/api/users/{name}", user_writes.put_user, methods=["PUT"]),
    Route("/api/users/{name}", user_writes.delete_user, methods=["DELETE"]),
    Route("/api/users/{name}/permissions", users.user_permissions),
    Route("/api/permissions", users.permissions),
    Route(_PERMISSIONS, user_writes.show_permissions, methods=["GET"]),
    Route(_PERMISSIONS, user_writes.put_permissions, methods=["PUT"]),
    Route(_PERMISSIONS, user_writes.delete_permissions, methods=["DELETE"]),
    Route(_TOPIC_PERMISSIONS, user_writes.show_topic_permissions, methods=["GET"]),
    Route(_TOPIC_PERMISSIONS, user_writes.put_topic_permissions, methods=["PUT"]),
    Route(_TOPIC_PERMISSIONS, user_writes.delete_topic_permissions, methods=["DELETE"]),
    Route("/api/aliveness-test/{vhost}", overview.aliveness_test),
    Route("/api/health/checks/virtual-hosts", overview.virtual_hosts_check),
    Route("/api/health/checks/port-listener/{port}", overview.port_listener_check),
    Route("/api/health/checks/ready-to-serve-clients", overview.ready_to_serve_clients),
    Route("/api/health/checks/protocol-listener/{protocol}", overview.protocol_listener_check),
    Route("/api/health/checks/node-is-quorum-critical", overview.single_node_check),
    Route("/api/health/checks/node-is-mirror-sync-critical", overview.single_node_check),
    Route("/api/queues", queues.list_queues),
    Route("/api/queues/{vhost}", queues.list_queues),
    Route(_QUEUE, queues.show_queue, methods=["GET"]),
    Route(_QUEUE, queues.declare_queue, methods=["PUT"]),
    Route(_QUEUE, queues.delete_queue, methods=["DELETE"]),
    Route(_QUEUE + "/contents", queues.purge_queue, methods=["DELETE"]),
    Route(_QUEUE + "/get", queues.get_messages, methods=["POST"]),
    Route(_QUEUE + "/bindings", queues.queue_bindings),
    Route("/api/exchanges", exchanges.list_exchanges),
    Route("/api/exchanges/{vhost}", exchanges.list_exchanges),
    Route(_EXCHANGE, exchanges.show_exchange, methods=["GET"]),
    Route(_EXCHANGE, exchanges.declare_exchange, methods=["PUT"]),
    Route(_EXCHANGE, exchanges.delete_exchange, methods=["DELETE"]),
    Route(_EXCHANGE + "/publish", exchanges.publish, methods=["POST"]),
    Route(_EXCHANGE + "/bindings/{side:str}", bindings.exchange_bindings),
    Route("/api/bindings", bindings.list_bindings),
    Route("/api/bindings/{vhost}", bindings.list_bindings),
    Route(_BINDING, bindings.bindings_between, methods=["GET"]),
    Route(_BINDING, bindings.create_binding, methods=["POST"]),
    Route(_BINDING + "/{props}", bindings.show_binding, methods=["GET"]),
    Route(_BINDING + "/{props}", bindings.delete_binding, methods=["DELETE"]),
    Route("/api/connections", connections.list_connections),
    Route("/api/connections/{name}", connections.show_connection, methods=["GET"]),
    Route("/api/connections/{name}", connections.close_connection, methods=["DELETE"]),
    Route("/api/connections/{name}/channels", connections.connection_channels),
    Route("/api/channels", connections.list_channels),
    Route("/api/channels/{name}", connections.show_channel),
    Route("/api/consumers", connections.list_consumers),
    Route("/api/consumers/{vhost}", connections.list_consumers),
]
