"""doctor's CLI under a spy (every command it runs on a host, and no process it spawns) and a recorded
snapshot as doctor's two scripts print it: shared by the remote and the gateway doctor tests."""

from qwen27b.controller import remote
from qwen27b.tools.doctor import HostSnapshot
from tests.support.paths import ROOT


JOURNALS = ROOT / "tests" / "fixtures" / "journals"
HTTP = ("health.txt", "metrics.txt")  # doctor's second script (collection.http_commands)
SHIM = """
import sys, time
from qwen27b.controller import remote
remote.new_nonce = lambda: "recorded"
def audit(event, args):
    if event in ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.fork"):
        print("SPAWN", event, repr(args)[:200], file=sys.stderr, flush=True)
sys.addaudithook(audit)
run = remote.run_command
def spy(state, host, command, timeout=60):
    started = time.monotonic()
    answer = run(state, host, command, timeout)
    print("RUN", host.name, host.data.ssh_port, host.data.ssh_user, "http" if "BEGIN health.txt" in command else "main",
          started, time.monotonic(), file=sys.stderr, flush=True)
    return answer
remote.run_command = spy
from qwen27b.tools.doctor import main
sys.exit(main(sys.argv[1:]))
"""


def phases(name: str) -> tuple[str, str, dict]:
    """The recorded snapshot as doctor's two scripts print it (main script, /health + /metrics) and
    its host data."""
    snap = HostSnapshot.load(JOURNALS / name)
    main = {k: v for k, v in snap.outputs.items() if k not in HTTP}
    http = {k: v for k, v in snap.outputs.items() if k in HTTP}
    return (remote.render_output(main, "recorded", snap.codes), remote.render_output(http, "recorded", snap.codes),
            snap.data)
