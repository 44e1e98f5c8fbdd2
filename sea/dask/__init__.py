"""Sea across machines (SeaDask, Pydra on Dask): the parts only a Dask run uses.

- :mod:`sea.dask.options`: the ``dask`` settings (a scheduler's address, a local cluster, SLURM jobs);
- :mod:`sea.dask.node_storage`: one machine's tiers and engine, as a Dask worker plugin;
- :mod:`sea.dask.locality`: the client's choice of worker for each node (where its inputs are).
"""
