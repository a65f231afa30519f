"""The ``organization`` kind: a machine of the hub's organization service, reached through that service.

``client.py`` finds the service and speaks to it with the server's hub token; ``engine.py`` turns each
engine call into one of its routes; ``wire.py`` is the JSON both sides exchange. The service itself,
a face, is ``org/``.
"""
