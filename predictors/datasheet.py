"""The ``datasheet`` cost model: :class:`~whatif.predictors.costs.TraceCostModel` without its two
calibrations on the trace, so every rate comes from the device catalog
(:mod:`whatif.hardware.devices`):

* DRAM bandwidth: ``ASSUMED_BW_EFFICIENCY`` of the device's peak (the trace model measures the
  median achieved bandwidth of the trace's memory-bound kernels); it prices ``fuse`` and the bytes
  of kernels recorded without shapes;
* collectives: the uncalibrated NCCL tuning model on the topology preset
  (:func:`whatif.hardware.collectives.collective_time_ns`; the trace model fits it to the trace's
  own collective kernels when its GPU is of the preset's family).

Kernel facts, ``precision``, ``gpu`` and the roofline that prices resharded kernels are the same in
both (they already scale the measured time by datasheet ratios). The trace model's fallbacks for a
trace that cannot calibrate are exactly this model, so the two agree on such traces; comparing
them on one that can shows how much the calibrations move a prediction.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from whatif.depgraph.graph import TaskGraph

from .cost_models import CostModelName, register_cost_model
from .costs import TraceCostModel

if TYPE_CHECKING:
    import numpy as np

    from whatif.hardware.collectives import CollectiveCalibration
    from whatif.hardware.topology import Topology


@register_cost_model
class DatasheetCostModel(TraceCostModel):
    """Device-catalog rates only; see the module docstring."""

    key = CostModelName.DATASHEET

    def _measured_bandwidth_bytes_per_s(self, graph: TaskGraph, facts: dict[str, np.ndarray]) -> float | None:
        return None

    def _collective_calibration(self, base: Topology, topo: Topology) -> CollectiveCalibration | None:
        return None
