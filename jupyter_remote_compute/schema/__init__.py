"""The types every boundary exchanges, defined once: what the REST API, the CLI's ``--json``, the state
file and the front end read and write (``openapi.yaml`` and ``src/openapi.d.ts`` are generated from them).

The ground layer: it imports pydantic, the standard library and the other ground modules only.
"""
