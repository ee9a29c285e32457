"""The HTTP API: topics (the Kafka view of streams) over JSON, served by hypercorn's Trio worker
inside the broker's nursery. The management API will extend this same app.

- ``GET /health`` (open); ``PUT /topics/{topic}`` declares a partitioned stream;
  ``POST``/``GET /topics/{topic}/messages``; ``GET /topics/{topic}/offsets``;
  ``GET /topics/{topic}/groups/{group}`` (``topic_routes.py``); the columnar bulk ``GET
  /topics/{topic}/partitions/{p}/records`` and ``POST /topics/{topic}/records``, in
  ``recordbatch.py``'s formats, for the Spark data source (``record_routes.py``); each a thin
  translation to the vhost's ``broker.streams.service.StreamService``. Every route takes an
  optional ``vhost`` query parameter (default ``/``).
- HTTP Basic authentication against the broker's users and their vhost permissions
  (``auth.py``); request bodies, parameters and records read and checked (``inputs.py``);
- every error is JSON with its status (``errors.py``);
- reads answered as streams under the broker's read budget (``read_response.py``);
- Prometheus' ``/metrics``, ``/metrics/per-object``, ``/metrics/detailed`` (``metrics.py``,
  ``metrics_routes.py``), on their own port (``serve_metrics``);
- requests from other sites' pages refused in front of every route (``cross_site.py``);
- in a cluster, the ``ClusterNode`` in ``app.state.cluster`` (``cluster_state.py``):
  ``GET /cluster`` (``cluster_routes.py``), every node in ``/api/nodes``, the partitions'
  leaders and ISRs in ``GET /topics/{topic}``, their metrics (``metrics_cluster.py``);
- the app and ``serve_http`` (``app.py``).
"""

from .app import create_app, serve_http, serve_metrics

__all__ = ["create_app", "serve_http", "serve_metrics"]
