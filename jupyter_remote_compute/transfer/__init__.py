"""Moving files: which inputs a job sends and their digests."""
