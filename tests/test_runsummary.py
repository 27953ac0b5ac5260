"""The end-of-run summary's pure parts: the re-run command and the table. (Built from a real
pyinfra State in tests/test_plans.py on @fake hosts and in tests/e2e/test_faults.py on a real one.)"""

from qwen27b.controller.runsummary import DRIVER_FIRST, Outcome, rerun_command, summary_text


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
