"""The only place with sockets: the listener, connections and their channels."""
