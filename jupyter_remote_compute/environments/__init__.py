"""What a job runs in: its Python environment, its container image, and the registry it is pulled from."""
