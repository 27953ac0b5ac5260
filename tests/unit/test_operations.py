"""qwen27b.controller.operations: JSON fixture cases run the way pyinfra tests its own operations.

One generated TestCase per operation; one test per tests/operations/<op>/<case>.json with the keys
`args`, `kwargs`, `facts` (keyed "<module>.<Fact>", then "arg=value" for facts with arguments),
`local_files` (controller files, faked), `commands` (a FileUploadCommand is ["upload", src, dest]),
`noop_description`, or `exception` ({name, message}) for refused arguments.
"""


from pyinfra_testing.operations import make_operation_tests
from tests.support.paths import TESTS

OPERATION_CASES = TESTS / "operations"
OPERATIONS = ("apt_hold", "directories", "push_files", "secret_file", "symlink_switch")

for _op in OPERATIONS:
    globals()[f"TestOperation_{_op}"] = make_operation_tests("qwen27b.controller", f"operations.{_op}", OPERATION_CASES / _op)

del _op


def test_apt_commands_wait_for_the_dpkg_lock_and_release_holds_when_told():
    """Issue 24: unattended-upgrades holds the dpkg lock on a first boot; every apt-get the roles build
    waits for it, bounded by the stack's tools.apt.lock_timeout_s."""
    from qwen27b.plan.stack import load_stack
    from roles.nvidia import replace_command
    from roles._common import apt_lock_option

    seconds = load_stack()["tools"]["apt"]["lock_timeout_s"]
    assert apt_lock_option() == f"-o DPkg::Lock::Timeout={seconds}" and isinstance(seconds, int) and seconds > 0
    plain = replace_command("nvidia-driver-580-server", ("nvidia-driver-470",))
    assert f"-o DPkg::Lock::Timeout={seconds}" in plain and "--allow-change-held-packages" not in plain
    held = replace_command("nvidia-driver-580-server", ("nvidia-driver-470",), ("nvidia-driver-470",))
    assert held.endswith("--allow-change-held-packages --purge install nvidia-driver-580-server nvidia-driver-470-")


def test_a_bulk_push_lets_the_ssh_connection_wait_for_a_rekey():
    """A real paramiko Transport (over a socket pair, never started): its senders wait 30 s for a
    re-key by default, and push_files raises that to REKEY_WAIT_S (a loaded test host's re-key took
    longer in CI); never lowered; a connector without a paramiko client is left alone."""
    import socket
    from types import SimpleNamespace

    import paramiko

    from qwen27b.controller.operations import REKEY_WAIT_S, patient_rekey

    ours, theirs = socket.socketpair()
    try:
        transport = paramiko.Transport(ours)
        assert transport.clear_to_send_timeout == 30.0  # paramiko's default, the attribute it reads
        connector = SimpleNamespace(client=SimpleNamespace(get_transport=lambda: transport))
        patient_rekey(connector)
        assert transport.clear_to_send_timeout == REKEY_WAIT_S >= 120
        transport.clear_to_send_timeout = 900.0
        patient_rekey(connector)
        assert transport.clear_to_send_timeout == 900.0
        patient_rekey(SimpleNamespace())  # @local, @fake
        patient_rekey(SimpleNamespace(client=SimpleNamespace(get_transport=lambda: None)))  # not connected
    finally:
        ours.close()
        theirs.close()
