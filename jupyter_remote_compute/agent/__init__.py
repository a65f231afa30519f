"""The pull agent (``client.py``, its connection to the server ``server.py``, its command line
``command.py``): standard library only, served by the server as ``agent.pyz``.

Nothing here imports the rest of the package, so the same files run on a bare Python on the far
machine and as ``jupyter remote-compute agent`` where the package is installed.
"""
