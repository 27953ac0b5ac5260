"""A deploy with one failing check (tests/unit/slow/test_failing_check.py): its failure is one red line."""

from pyinfra import host
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python, server

from roles._common import check


@check
def _verify(marker: str) -> None:
    if host.name != "@local":  # the host context is set for the check, as before
        raise OperationError(f"wrong host {host.name}")
    raise OperationError(f"verify failed: {marker} (journal and health status in the run report)")


python.call(name="verify: a check that fails", function=_verify, marker="the served name is missing")
server.shell(name="after the failed check", commands=["echo never"])
