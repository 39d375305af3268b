"""Names that vulture (the dead-code check of `make lint`) reports unused but that are used where it cannot see:
called by a framework, read by a library, or kept on purpose. Each names one thing and says why. Names that a
framework finds by a pattern (gRPC interceptors, `cmd_*` handlers, http.server's `do_*`, pytest's hooks) are
ignored by pattern in pyproject.toml's [tool.vulture] instead.

Before adding a name here, check it is not simply dead: then delete it (and its test)."""

from peloton.cli import exits, transport
from peloton.cli.parser import Parser
from peloton.hostmgr.mesos.events import MesosTaskStatus
from peloton.hostmgr.service import HostManagerServicer
from peloton.hostmgr.sim.service import SimServicer
from peloton.modelaware.document import Description
from peloton.resmgr.service import ResourceManagerServicer
from peloton.store.models import ResourcePoolRow


def _fields(status: MesosTaskStatus, description: Description) -> tuple[object, ...]:
    """Fields of slotted dataclasses (read through an instance: the class has no such attribute)."""
    return (status.timestamp, status.unreachable_time_ns,  # Mesos's task status, parsed whole; not read yet
            description.dataset_samples)  # a field of the model document: parsed, checked, written back (getattr)


USED_WHERE_VULTURE_CANNOT_SEE = (
    _fields,
    Parser._check_value,
    Parser().formatter_class,  # read by argparse when it formats the help (set per command in cli/parser.py)  # argparse calls it: overridden so that a bad choice is reported our way
    SimServicer.FailHost,  # a gRPC method (docs/running.md): called by clients outside this repository
    exits.EXIT_OK,  # the table of exit codes is complete (docs/cli.md)
    transport.StatusCode.ABORTED,  # gRPC's status codes, complete: what a server may send
    transport.StatusCode.OUT_OF_RANGE,
    transport.StatusCode.DATA_LOSS,
    # the internal services, called by gRPC from the other --role processes (api/grpc_clients.py names each
    # method as a string); in one process the components call each other directly (resmgr/hostmgr inprocess.py)
    HostManagerServicer.SyncHosts,
    HostManagerServicer.ClaimPlacements,
    HostManagerServicer.ReleaseClaims,
    HostManagerServicer.ClusterCapacity,
    HostManagerServicer.LaunchGangs,
    HostManagerServicer.WaitTaskEvents,
    HostManagerServicer.AckTaskEvents,
    HostManagerServicer.ReconcileTasks,
    HostManagerServicer.ReadTaskLog,
    HostManagerServicer.ListDrains,
    HostManagerServicer.RemoveSandboxes,
    ResourceManagerServicer.EnqueueGangs,
    ResourceManagerServicer.DequeueGangs,
    ResourceManagerServicer.SetPlacements,
    ResourceManagerServicer.GetPlacements,
    ResourceManagerServicer.AckPlacements,
    ResourceManagerServicer.GetPoolUsage,
    ResourceManagerServicer.PreviewAdmission,
    ResourcePoolRow.limit_,  # the column `limit`, set by name ("limit_") in store/repo.py's inserts and updates
)
