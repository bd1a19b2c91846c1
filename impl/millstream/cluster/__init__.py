"""A millstream cluster: hosts coordinated through ZooKeeper (issue 23; DESIGN §10).

* ``_assignment`` -- the container -> host map, a pure function (balanced, minimal movement).
* ``_zookeeper`` -- ``ClusterMember``: registration, the leader election, writing and watching the
  map on ZooKeeper (its docstring holds the znode layout).
* ``_containers`` -- ``ContainerManager``: a host starts the containers the map gives it and stops
  those it takes away.
"""

from millstream.cluster._assignment import assign, check_assignment, moved

__all__ = ["assign", "check_assignment", "moved"]
