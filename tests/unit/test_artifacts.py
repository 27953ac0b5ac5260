"""The controller cache's manifests: reused while sizes match, recomputed (keeping other keys)
when files change, sidecar files never listed as artifacts."""

import json

from qwen27b.controller.artifacts import dir_manifest, sha256_file


def test_manifest_is_written_reused_and_refreshed(tmp_path):
    (tmp_path / "a.whl").write_bytes(b"aaa")
    (tmp_path / "SHA256SUMS").write_text("sidecar")
    (tmp_path / ".hidden").write_text("x")
    first = dir_manifest(tmp_path)
    assert first == {"a.whl": sha256_file(tmp_path / "a.whl")}
    data = json.loads((tmp_path / "manifest.json").read_text())
    data["schema"] = 7
    data["files"]["a.whl"]["sha256"] = "f" * 64  # a stale hash with the right size is trusted (no rehash)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    assert dir_manifest(tmp_path) == {"a.whl": "f" * 64}
    (tmp_path / "a.whl").write_bytes(b"longer now")
    (tmp_path / "b.whl").write_bytes(b"b")
    refreshed = dir_manifest(tmp_path)
    assert refreshed == {"a.whl": sha256_file(tmp_path / "a.whl"), "b.whl": sha256_file(tmp_path / "b.whl")}
    assert json.loads((tmp_path / "manifest.json").read_text())["schema"] == 7  # other keys kept
