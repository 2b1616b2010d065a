"""Per-task columns the analysis derives from the baseline graph's own replay, written once,
before any transform: part of building the graph (like its layers and phases), so they carry no
change-log entry. Every primitive carries them to the tasks it keeps and copies; tasks a
primitive inserts get NaN. The only ones so far are the replay's reference for kernels that share
the GPU with collectives (:mod:`whatif.transforms.sharing`)."""
from __future__ import annotations

import numpy as np

from .graph import GraphError, TaskGraph


def annotate(graph: TaskGraph, **columns: np.ndarray) -> TaskGraph:
    """``graph`` (modified in place and returned) with each of ``columns``: one float per task.

    Raises
    ------
    GraphError
        A column does not hold one value per task.

    >>> import pandas as pd
    >>> g = TaskGraph(tasks=pd.DataFrame({"dur_ns": [1, 2]}), edges=pd.DataFrame(), resources=pd.DataFrame(),
    ...               steps=pd.DataFrame())
    >>> annotate(g, share_ref=np.array([0.5, np.nan])).tasks["share_ref"].tolist()
    [0.5, nan]
    """
    for name, values in columns.items():
        values = np.asarray(values, dtype=float)
        if values.shape != (len(graph.tasks),):
            raise GraphError(f"annotation {name}: {values.shape} values for {len(graph.tasks)} tasks")
        graph.tasks[name] = values
    return graph
