"""Every write to MLflow: the recorder process, a job's run, the far store's replay, the environment and
image records, a pipeline's parent run."""
