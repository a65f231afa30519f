"""The job's MLflow store under a scheme of its own: ``remote-compute:///<job folder>/mlruns``.

Not imported here: the launcher (``engines/launcher.py``) writes this file into the job's folder, beside
a ``*.dist-info`` whose entry points (``mlflow.tracking_store``, ``mlflow.model_registry_store``) name
the two functions below, and puts that folder on the job's ``PYTHONPATH`` when the user's own store is
not a folder. MLflow then opens the job's store through them: the very folder store a ``file://`` URI
opens (the far side's scripts and the replay read it as they always did), while a script that asks
``urlparse(mlflow.get_tracking_uri()).scheme`` sees a store that is not ``file``, as it would here, and
runs its registry code. Standard library only at import: MLflow loads its plugins as it starts.
"""

SCHEME = "remote-compute"


def _file_uri(store_uri):
    """``remote-compute:///x/mlruns`` as the ``file:///x/mlruns`` it stands for."""
    if not store_uri.startswith(SCHEME + ":"):
        raise ValueError(f"not a {SCHEME} store: {store_uri!r}")
    return "file:" + store_uri[len(SCHEME) + 1 :]


def tracking_store(store_uri, artifact_uri=None, **_):
    """MLflow's folder tracking store, as MLflow opens it for the ``file://`` URI."""
    from mlflow.store.tracking.file_store import FileStore

    uri = _file_uri(store_uri)
    return FileStore(uri, uri)


def registry_store(store_uri, **_):
    """MLflow's folder model registry, in the same folder as the tracking store."""
    from mlflow.store.model_registry.file_store import FileStore

    return FileStore(_file_uri(store_uri))
