"""A millstream cluster: hosts coordinated through ZooKeeper (issue 23; DESIGN §10).

* ``_assignment`` -- the container -> host map, a pure function (balanced, minimal movement).
* ``_zookeeper`` -- ``ClusterMember``: registration, the leader election, writing and watching the
  map on ZooKeeper (its docstring holds the znode layout).
* ``_containers`` -- ``ContainerManager``: a host starts the containers the map gives it (fencing the
  previous owner's log by opening it) and stops those it takes away.

Importing this package needs kazoo (the ``cluster`` extra).
"""

from millstream.cluster._assignment import assign, check_assignment, moved
from millstream.cluster._containers import ContainerManager
from millstream.cluster._zookeeper import Assignment, ClusterMember, cluster_paths

__all__ = ["Assignment", "ClusterMember", "ContainerManager", "assign", "check_assignment", "cluster_paths", "moved"]
