"""The end of `./run demo`: what a lab admin checks by hand, shown for the demo test host.

`systemctl status qwen27b` on the host, the health endpoint's answer, and the verify table.
"""

from __future__ import annotations

import json
import runpy
import shlex
import subprocess
import urllib.request
from pathlib import Path

from qwen27b.controller.apikey import key_file, shown
from qwen27b.controller.artifacts import cache_root
from qwen27b.controller.postdeploy import HostResult, direct_opener, report_table
from qwen27b.onhost.secretfile import load_secret
from qwen27b.plan.stack import api_key_env_file, load_stack

DEMO_INVENTORY = "inventory/testhost.py"


def client_lines(key_path: str, url: str) -> list[str]:
    """How a client uses the key (its file named, the key never printed): the openai client reads
    OPENAI_API_KEY and OPENAI_BASE_URL, curl takes the header."""
    key = f"$(sed 's/^VLLM_API_KEY=//' {shlex.quote(key_path)})"
    return [f"export OPENAI_API_KEY=\"{key}\" OPENAI_BASE_URL={shlex.quote(url + '/v1')}",
            "python3 -c 'from openai import OpenAI; c = OpenAI(); m = c.models.list().data[0].id; "
            "print(c.chat.completions.create(model=m, messages=[{\"role\": \"user\", \"content\": \"Hi\"}], "
            "max_tokens=16).choices[0].message.content)'",
            f"curl -H \"Authorization: Bearer {key}\" {shlex.quote(url + '/v1/models')}"]


def main() -> None:
    state = cache_root() / "testhosts" / "demo"
    hosts = runpy.run_path(str(state / "inventory.py"))["testhosts"]
    lab_key = key_file(DEMO_INVENTORY)  # made by the deploy: the demo's inventory names no key file
    key = load_secret(str(lab_key)) if lab_key.is_file() else None
    on_host_key = api_key_env_file(load_stack()["paths"])
    if key:
        url = f"http://{hosts[0][1]['ssh_hostname']}:8000" if hosts else "URL"
        print(f"\n--> the API is guarded by the lab key in {shown(lab_key)} (never printed); with the openai client "
              "(pip install openai), or curl:\n" + "\n".join(f"    {line}" for line in client_lines(shown(lab_key), url)))
    for name, data in hosts:
        print(f"\n--> {name}: systemctl status qwen27b")
        subprocess.run(["ssh", "-F", str(state / "ssh_config"), name,
                        "systemctl status qwen27b --no-pager -n 0 | head -12"], check=False)
        url = f"http://{data['ssh_hostname']}:8000"
        for path in ("/health", "/v1/models"):
            request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {key}"} if key else {})
            try:
                with direct_opener().open(request, timeout=10) as response:
                    body = response.read().decode()[:300]
                    print(f"--> GET {url}{path}: {response.status} {body}")
            except OSError as error:
                print(f"--> GET {url}{path}: {error}")
        health = subprocess.run(["ssh", "-F", str(state / "ssh_config"), name,
                                 "/opt/qwen27b/current/venv/bin/qwen27b-health --no-restart "
                                 f"--url {url} --status-file /tmp/qwen27b-demo-health.json"
                                 + (f" --api-key-file {on_host_key}" if key else "")],
                                capture_output=True, text=True)
        print(f"--> qwen27b-health (exit {health.returncode}):\n{health.stdout}")
    report = Path("reports/latest.json")
    if report.exists():
        results = [HostResult(**h) for h in json.loads(report.read_text())["hosts"]]
        print(f"--> verify ({report.resolve().name})\n{report_table(results)}")


if __name__ == "__main__":
    main()
