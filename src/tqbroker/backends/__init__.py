"""Message storage backends: the ``Backend`` protocol and the built-in implementations."""
