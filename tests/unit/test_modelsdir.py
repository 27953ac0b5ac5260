"""Models on the big disk (issue 52 item 4, qwen27b/plan/modelsdir.py): qwen27b_models_dir checked
before any host is touched, the HostLayout's models dir and links there, the disk check on the
recorded hosts v100x4-small-var (/var a 39 GiB volume: `df -P -B1` in its real format, written by
hand) and v100x4-data-disk (the same box, /data a 7 TB array), and the uninstall's plan for weights
outside the state dir."""

import sys

import pytest

from qwen27b.plan.gate import RefusedHost, decide
from qwen27b.plan.hostdata import settings_for
from qwen27b.plan.lifecycle import Installed, UninstallOptions, probe_paths, uninstall_plan
from qwen27b.plan.settings import BadHostData
from qwen27b.plan.stack import load_stack, with_models_dir
from tests.support.paths import TESTS

sys.path.insert(0, str(TESTS))
from recordings import recorded_facts  # noqa: E402

PATHS = load_stack()["paths"]
DATA = "/data/qwen27b/models"


@pytest.mark.parametrize("value, says", [
    ("data/qwen27b/models", "not an absolute path"),
    ("/data", "top-level directory"),
    ("/data/a b/models", "each level takes"),
    ("/data/../etc/models", "each level takes"),
    ("/data/$(id)/m", "each level takes"),
    ("/var/lib/qwen27b/weights", "the service's state dir"),  # the service user could swap it
    ("/var/lib/qwen27b/cache/m", "state dir"),
    ("/var/lib", "holds /var/lib/qwen27b"),
    ("/opt/qwen27b/models", "the deploy's own tree"),
    ("/etc/qwen27b/models", "config dir"),
    ("/home/lab/models", "ProtectHome"),  # the service's sandbox hides it
    ("/tmp/models", "under /tmp"),
])  # fmt: skip
def test_a_bad_models_dir_is_refused_naming_key_and_fix(value, says):
    with pytest.raises(BadHostData) as refused:
        settings_for("gpu1", {"qwen27b_models_dir": value})
    text = str(refused.value)
    assert "gpu1" in text and "qwen27b_models_dir" in text and says in text and "/data/qwen27b/models" in text


def test_a_good_models_dir_moves_the_models_and_their_links_only():
    s = settings_for("gpu1", {"qwen27b_models_dir": DATA + "/"})
    assert s.models_dir == DATA
    assert settings_for("gpu1", {"qwen27b_models_dir": PATHS["models"]}).models_dir == PATHS["models"]
    moved = with_models_dir(PATHS, DATA)
    assert (moved["models"], moved["current_model"]) == (DATA, DATA + "/current")
    assert {k: v for k, v in moved.items() if k not in ("models", "current_model")} == \
        {k: v for k, v in PATHS.items() if k not in ("models", "current_model")}
    assert with_models_dir(PATHS, None) is PATHS


def test_small_var_is_refused_and_the_fix_names_the_setting():
    with pytest.raises(RefusedHost) as refused:
        decide("h", recorded_facts("v100x4-small-var"), load_stack(), settings_for("h", {}))
    (cause, fix), = [p for p in refused.value.problems if "too little disk" in p[0]]
    assert "on /var for /var/lib/qwen27b/models" in cause
    assert "qwen27b_models_dir" in fix and "bind-mount" in fix and "symlink" in fix


def test_the_models_dir_setting_puts_weights_links_and_disk_check_on_data():
    d = decide("h", recorded_facts("v100x4-data-disk"), load_stack(), settings_for("h", {"qwen27b_models_dir": DATA}))
    at = d.stack.layout
    assert (at.models, at.current_model, at.draft_link) == (DATA, DATA + "/current", DATA + "/draft")
    assert d.model_path == DATA + "/current" and d.draft_path == DATA + "/draft"
    assert at.model_dir(d.stack.model).startswith(DATA + "/")
    assert at.state == PATHS["state"] and at.cache == PATHS["cache"]  # the state dir stays where it was
    assert any("qwen27b_models_dir" in n and DATA in n for n in d.serve.notes)
    # the fetches land there: every revision dir the weights role fills is under /data
    assert at.model_dir(d.stack.draft).startswith(DATA + "/")


def test_uninstall_keeps_weights_outside_the_state_dir_and_hands_them_to_root():
    paths = with_models_dir(PATHS, DATA)
    assert DATA in probe_paths(paths, "/etc/systemd/system", "/var/lib/node_exporter/textfile/qwen27b.prom")
    have = Installed(paths={PATHS["state"]: "998:998", DATA: "root:998", DATA + "/current": "root:root"})
    removals, kept = uninstall_plan(have, paths, UninstallOptions(), "/etc/systemd/system", "/x/qwen27b.prom")
    by_what = {r.what: r.commands for r in removals}
    assert by_what[PATHS["state"]] == (f"rm -rf {PATHS['state']}",)  # no weights in it
    handed = by_what[f"{DATA}/current in {DATA}: handed to root"]
    assert handed[0] == f"rm -f {DATA}/current" and handed[1].endswith(f"chown -h root:root {DATA} && chmod 0755 {DATA}")
    assert any(k.startswith(f"{DATA}: the model weights") for k in kept)
    # a second run: the state dir gone, the weights root's: nothing more
    assert uninstall_plan(Installed(paths={DATA: "root:root"}), paths, UninstallOptions(), "/u", "/x/q.prom")[0] == []
    # with the weights: the models dir goes too
    removals, kept = uninstall_plan(have, paths, UninstallOptions(weights=True), "/u", "/x/q.prom")
    assert (f"{DATA} with the model weights", (f"rm -rf {DATA}",)) in [(r.what, r.commands) for r in removals]
    assert not kept or not any(DATA in k for k in kept)


def test_doctor_reads_the_model_link_and_disk_where_the_setting_put_them():
    from qwen27b.tools.doctor.collection import commands, with_host_models_dir
    stack = load_stack()
    moved = with_host_models_dir(stack, "h", {"qwen27b_models_dir": DATA})
    assert f"m={DATA}; p={DATA}/current;" in commands(moved)["model.txt"]
    assert any(DATA in c for c in commands(moved).values() if "df -P -B1" in c)
    # a bad value is doctor's settings check's to name: the default is read
    assert with_host_models_dir(stack, "h", {"qwen27b_models_dir": "/home/x/m"}) is stack


def test_status_reads_the_model_link_where_the_setting_put_it():
    from qwen27b.plan.modelsdir import host_paths
    from qwen27b.tools.status import commands
    assert commands(host_paths(PATHS, "h", {"qwen27b_models_dir": DATA}))["model"] == f"readlink {DATA}/current"
    assert host_paths(PATHS, "h", {}) is PATHS and host_paths(PATHS, "h", {"qwen27b_models_dir": "rel/x"}) is PATHS


def test_the_directories_ops_refusal_of_a_link_names_the_setting():
    """The op's case file (tests/operations/directories/a-link-at-the-models-path-names-the-setting.json)
    holds the hint the toolchain role passes for the models path."""
    import json
    from qwen27b.plan.modelsdir import MODELS_LINK_HINT
    case = json.loads((TESTS / "operations" / "directories" / "a-link-at-the-models-path-names-the-setting.json").read_text())
    assert case["kwargs"]["hints"]["/var/lib/qwen27b/models"] == MODELS_LINK_HINT
    assert "qwen27b_models_dir" in MODELS_LINK_HINT and "bind-mount" in MODELS_LINK_HINT
