"""The organization service on JupyterHub: machines an admin sets once, for every user of the hub."""
