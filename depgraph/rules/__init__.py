"""The build pipeline: :data:`RULES`, the declared order of the steps that link a trace's tasks
(:func:`whatif.depgraph.tasks.initial_state`) into a graph. An :class:`EdgeRule` returns the edges
of one kind; an :class:`Adjustment` rewrites durations, latencies or attribution earlier steps
made, or adds tasks. Each is one module here with its test in ``tests/test_graph_rules.py``;
``docs/architecture.md`` lists them in this order."""
from __future__ import annotations

from .anchor import AnchorRoots
from .attribution import LauncherAttribution
from .base import Adjustment, BuildStep, EdgeRule, check_order
from .blocking import BlockingCallIssue
from .collectives import ArrivalOrder, ClockAlignment, CollectiveBarriers, CollectiveSplit
from .contention import ContentionLaunches, DeviceContention
from .event_wait import EventWaitLaunches, EventWaits
from .flow import Flows, FlowWakesThread
from .forkjoin import BurstGaps, ForkJoins
from .launch import LaunchEdges
from .launch_queue import LAUNCH_QUEUE_DEPTH, LaunchQueue
from .steps import SingleStep, StepWindows
from .stream import StreamOrder
from .sync import SyncEdges, SyncWakeUps
from .thread import ThreadOrder

RULES: tuple[BuildStep, ...] = (
    BlockingCallIssue(),
    ThreadOrder(),
    LauncherAttribution(),
    LaunchEdges(),
    StreamOrder(),
    LaunchQueue(),
    SyncEdges(),
    DeviceContention(),
    EventWaits(),
    EventWaitLaunches(),
    ContentionLaunches(),
    SyncWakeUps(),
    Flows(),
    FlowWakesThread(),
    ForkJoins(),
    BurstGaps(),
    ClockAlignment(),
    CollectiveSplit(),
    ArrivalOrder(),
    CollectiveBarriers(),
    StepWindows(),
    SingleStep(),
    AnchorRoots(),
)
check_order(RULES)

__all__ = ["LAUNCH_QUEUE_DEPTH", "RULES", "Adjustment", "AnchorRoots", "ArrivalOrder", "BlockingCallIssue",
           "BuildStep", "BurstGaps", "ClockAlignment", "CollectiveBarriers", "CollectiveSplit", "ContentionLaunches",
           "DeviceContention", "EdgeRule",
           "EventWaitLaunches", "EventWaits", "FlowWakesThread", "Flows", "ForkJoins", "LaunchEdges", "LaunchQueue",
           "LauncherAttribution",
           "SingleStep", "StepWindows", "StreamOrder", "SyncEdges", "SyncWakeUps", "ThreadOrder", "check_order"]
