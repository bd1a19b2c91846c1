"""A millstream cluster: hosts coordinated through ZooKeeper (issue 23; DESIGN §10).

* ``_assignment`` -- the container -> host map, a pure function (balanced, minimal movement).
* ``_zookeeper`` -- ``ClusterMember``: registration, the leader election, writing and watching the
  map on ZooKeeper (its docstring holds the znode layout).
* ``_containers`` -- ``ContainerManager``: a host starts the containers the map gives it (fencing the
  previous owner's log by opening it) and stops those it takes away.
* ``_node`` -- ``ClusterNode``: a segment-store server whose containers are the ones the manager runs,
  registered in ZooKeeper by the member (start and stop order in its docstring).

The pure parts import nothing outside the standard library and millstream; ``ClusterMember`` and
``ContainerManager`` need kazoo (the ``cluster`` extra) and are imported when first used, so that the
assignment's contracts can be checked (``proofs``) where kazoo is not installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from millstream.cluster._assignment import assign, check_assignment, moved

if TYPE_CHECKING:
    from millstream.cluster._containers import ContainerManager
    from millstream.cluster._node import ClusterNode
    from millstream.cluster._zookeeper import Assignment, ClusterMember, cluster_paths

__all__ = ["Assignment", "ClusterMember", "ClusterNode", "ContainerManager", "assign", "check_assignment",
           "cluster_paths", "moved"]

_LAZY = {"Assignment": "_zookeeper", "ClusterMember": "_zookeeper", "cluster_paths": "_zookeeper",
         "ContainerManager": "_containers", "ClusterNode": "_node"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"millstream.cluster.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'millstream.cluster' has no attribute {name!r}")
