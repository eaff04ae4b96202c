"""The scheduling brain: a pure event -> state -> policy -> actions loop.

Imports no torch, ray, vllm or simpy.  ``Controller`` (``loop.py``) is the entry point;
``Runtime`` (``runtime.py``) is what a simulator or a real cluster implements.
"""

from bidirl.controller.actions import (
    PRIMARY,
    Action,
    AssignGroups,
    Chunk,
    Lend,
    MicroBatch,
    Reclaim,
    StartTrainStep,
    SyncWeights,
)
from bidirl.controller.cluster import ClusterSpec
from bidirl.controller.events import (
    DeviceLent,
    DeviceReclaimed,
    Event,
    GroupsCompleted,
    GroupsInterrupted,
    StageMeasured,
    Started,
    TrainStepFinished,
    WeightsSynced,
)
from bidirl.controller.loop import Controller
from bidirl.controller.runtime import Runtime
from bidirl.controller.state import ClusterState, Phase, UnitStatus

__all__ = [
    "PRIMARY", "Action", "AssignGroups", "Chunk", "ClusterSpec", "ClusterState", "Controller",
    "DeviceLent", "DeviceReclaimed", "Event", "GroupsCompleted", "GroupsInterrupted", "Lend",
    "MicroBatch", "Phase", "Reclaim", "Runtime", "StageMeasured", "StartTrainStep", "Started",
    "SyncWeights", "TrainStepFinished", "UnitStatus", "WeightsSynced",
]
