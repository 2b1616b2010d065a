"""Running whatif's work on several processes or a Ray cluster (issue 15, docs/scale.md):
:mod:`~whatif.scale.job` (a job of many ranks analyzed rank-parallel: :mod:`~whatif.scale.group`
one rank group's stages, :mod:`~whatif.scale.pool` and :mod:`~whatif.scale.ray_pool` where the
groups run), :mod:`~whatif.scale.ray_backend` (Ray as an optional extra),
:mod:`~whatif.scale.executor` (one function over chunks of items, on local processes or Ray
actors, each worker set up once) and :mod:`~whatif.scale.plans` (plan sweeps: TP x PP x DP x SP x
micro-batches x device)."""
