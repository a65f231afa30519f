"""The job lifecycle: specs, the shared state file, and the one service that drives every job."""
