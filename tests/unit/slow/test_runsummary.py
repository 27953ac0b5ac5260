"""The end-of-run summary's pure parts: the re-run command and the table. (Built from a real
pyinfra State in tests/plans/test_plans.py on @fake hosts and in tests/e2e/test_faults.py on a real one.)"""

import os
import subprocess
import sys

from qwen27b.controller.runsummary import DRIVER_FIRST, Outcome, rerun_command, summary_text
from tests.support.paths import ROOT



def test_rerun_keeps_the_command_and_limits_it_to_the_failed_hosts():
    argv = ["/x/site-packages/pyinfra/__main__.py", "inventory/my lab.py", "deploy.py", "-y", "--limit", "gpu-*",
            "--limit=gpu-c"]
    assert rerun_command(argv, ["gpu-a", "gpu-b"]) == \
        "pyinfra 'inventory/my lab.py' deploy.py -y --limit gpu-a --limit gpu-b"


def test_summary_counts_and_lists_each_host_and_only_failed_ones_get_a_rerun():
    results = [Outcome("gpu-a", "ok"), Outcome("gpu-b", "unreachable", "could not connect over SSH"),
               Outcome("gpu-c", "rolled back", "rolled back: crash loop"), Outcome("gpu-d", "planned")]
    text = summary_text(results, ["pyinfra", "lab.py", "deploy.py"])
    assert text.startswith("--> qwen27b run summary: 2 of 4 host(s) ok\nhost   outcome      detail\n")
    assert "gpu-b  unreachable  could not connect over SSH" in text
    assert text.rstrip().endswith("pyinfra lab.py deploy.py --limit gpu-b --limit gpu-c")
    assert "re-run" not in summary_text([Outcome("gpu-a", "ok")], ["pyinfra", "lab.py", "deploy.py"])


def test_rerun_line_masks_passwords_as_the_plans_do():
    """Issue 25: `--data ssh_password=...`, pyinfra's password flags and a URL's password were
    echoed in the re-run line; each is *** there, as redact_url shows URLs in the plans."""
    argv = ["pyinfra", "lab.py", "deploy.py", "--data", "ssh_password=hunter2", "--data=_sudo_password=s3cret",
            "--password", "pw1", "--key-password=pw2", "--data", "qwen27b_apt_proxy=http://bob:pw3@proxy:3128",
            "--data", "qwen27b_hf_token_file=secrets/hf.token", "--data", "qwen27b_port=8001"]
    line = rerun_command(argv, ["gpu-a"])
    for secret in ("hunter2", "s3cret", "pw1", "pw2", "pw3"):
        assert secret not in line
    assert line == ("pyinfra lab.py deploy.py --data 'ssh_password=***' '--data=_sudo_password=***' --password '***' "
                    "'--key-password=***' --data 'qwen27b_apt_proxy=http://bob:***@proxy:3128' "
                    "--data qwen27b_hf_token_file=secrets/hf.token --data qwen27b_port=8001 --limit gpu-a")


def test_a_driver_first_host_is_ok_and_the_summary_says_to_run_again_after_the_reboot():
    """The PG500 without a driver (GPU memory unknown): this run installs the driver only. The plan's
    warning said so; the summary, read at the end, says it too, with the command for those hosts."""
    results = [Outcome("gpu-a", "ok"), Outcome("gpu-b", "ok", DRIVER_FIRST, again=True),
               Outcome("gpu-c", "refused", "no GPU")]
    text = summary_text(results, ["pyinfra", "lab.py", "deploy.py", "--limit", "gpu-*"])
    assert text.startswith("--> qwen27b run summary: 2 of 3 host(s) ok")
    assert f"gpu-b  ok       {DRIVER_FIRST}" in text
    again = text.split("re-run the deploy after the driver's reboot, to serve on the host(s) whose driver came first:\n")
    assert len(again) == 2 and again[1].splitlines()[0].strip() == "pyinfra lab.py deploy.py --limit gpu-b"
    assert "--limit gpu-c" in again[0]  # the failed one has its own line
    assert "driver's reboot" not in summary_text([Outcome("gpu-a", "ok")], ["pyinfra", "lab.py", "deploy.py"])


def test_a_run_pyinfra_itself_stopped_is_never_ok(tmp_path):
    """The real CLI over @local: an upload fails with EOFError (paramiko's SFTP when the connection
    drops mid-file), which pyinfra does not catch: "An internal exception occurred", the run stops.
    Stop 36's CI: the summary then said "1 of 1 host(s) ok" (the operations that did run had
    succeeded, and the unfinished one was not counted). It names the step that did not finish."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    env.update(PYTHONPATH=str(ROOT), TARGET_DIR=str(tmp_path), QWEN27B_REPORTS=str(tmp_path / "reports"))
    result = subprocess.run([sys.executable, "-m", "pyinfra", "@local", str(ROOT / "tests/data/internal_error_deploy.py"),
                             "-y"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert (tmp_path / "first").exists() and not (tmp_path / "last").exists()  # it did stop mid-run
    assert "qwen27b run summary: 0 of 1 host(s) ok" in result.stderr, result.stderr[-3000:]
    assert ("@local  failed   the run stopped during 'upload over a connection that drops' (pyinfra's error is "
            "above): re-run to finish, done work is kept") in result.stderr


def test_a_failed_upload_names_its_cause_and_fix_in_the_summary(tmp_path):
    """Issue 48: an upload the connector fails by raising (paramiko's SFTP: PermissionError) leaves
    pyinfra no output for the operation, and the summary said only "at 'push the checkpoint': ".
    The real CLI over @local, whose `cp` into a missing directory raises the same way."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    env.update(PYTHONPATH=str(ROOT), TARGET_DIR=str(tmp_path), QWEN27B_REPORTS=str(tmp_path / "reports"))
    result = subprocess.run([sys.executable, "-m", "pyinfra", "@local", str(ROOT / "tests/data/upload_error_deploy.py"),
                             "-y"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    line = next((out for out in result.stderr.splitlines() if out.startswith("@local  failed")), "")
    dest = f"{tmp_path}/missing/model.safetensors.part"
    assert line.startswith(f"@local  failed   at 'push the checkpoint': uploading upload_error_deploy.py to {dest} "
                           "failed: "), result.stderr[-3000:]
    assert "No such file or directory" in line and line.endswith(f"check {tmp_path}/missing on the host, then re-run")


def test_an_upload_the_ssh_user_may_not_make_says_who_cannot_reach_what_and_the_fix():
    """paramiko's SFTP raises PermissionError(13, 'Permission denied'), naming no path."""
    from qwen27b.controller.operations import upload_failure

    text = upload_failure(PermissionError(13, "Permission denied"), "/ctl/model.safetensors",
                          "/var/lib/qwen27b/models/m/.incoming/model.safetensors.part", "admin")
    assert text.startswith("uploading model.safetensors to /var/lib/qwen27b/models/m/.incoming/model.safetensors.part "
                           "failed: Permission denied: the SSH user admin cannot write /var/lib/qwen27b/models/m/.incoming")
    assert "Fix: " in text and "searchable (o+x)" in text and text.endswith("then re-run")
    full = upload_failure(OSError(28, "No space left on device"), "/ctl/a", "/opt/x/a.part", None)
    assert "free space on the host's filesystem of /opt/x" in full
