"""`qwen27b bench --methods`: the method list, what a run report says ran, the comparison, and the
restore in every case (issue 22). No host: the deploy and the bench are stand-ins here; the real
pyinfra run is the e2e tier's."""

from __future__ import annotations

import argparse
import json

import pytest

from qwen27b.tools import bench as b
from qwen27b.tools import cli
from qwen27b.tools.bench import methods as M
from qwen27b.tools.bench.cli import build_parser, check_methods_args
from qwen27b.plan.hostdata import SPECULATIVE_MODES


def _level(conc, ttft, per_token, accepted=None, drafted=None, prompt=512, out=256):
    """One level as measure() builds it (summarize_level on per-request records and /metrics deltas)."""
    res = [{"ok": True, "start": 0.0, "end": ttft + (out - 1) * per_token + 0.01, "ttft_s": ttft,
            "latency_s": ttft + (out - 1) * per_token, "prompt_tokens": prompt, "completion_tokens": out,
            "finish_reason": "length"} for _ in range(2 * conc)]
    deltas = {"prefix_cache_hit_rate": 0.0, "preemptions": 0,
              "spec_acceptance_rate": accepted / drafted if drafted else None, "spec_acceptance_length": None}
    return b.summarize_level(conc, res, 2 * max(r["end"] for r in res), deltas, None, prompt, out)


def _run(levels, spec="off"):
    return {"schema": b.SCHEMA, "url": "http://10.0.0.5:8000", "model": "m", "api": "chat", "spec": spec,
            "max_model_len_label": "4096", "prompt_tokens": 512, "output_tokens": 256, "ceilings": None,
            "levels": levels, "warnings": []}


def _report(host="gpu-a", status="ok", attempts=None, url="http://10.0.0.5:8000"):
    """A run report's shape (controller/postdeploy.write_report): summary + hosts (HostResult)."""
    result = {"host": host, "status": status, "url": url, "reason": "", "attempts": attempts or []}
    if attempts:
        result["reason"] = f"verified on start {len(attempts)} of {len(attempts)} ({attempts[-1]['flags']})"
    return {"run": "r1", "hosts": [result], "summary": [{"host": host, "status": status, "detail": "verified"}]}


NGRAM_FELL_BACK = [{"number": 1, "flags": "speculative ngram (k=3)", "outcome": "failed",
                    "measured": {"acceptance": 0.6}, "why": "ngram accepted 59 of 87 ... restarting with speculative off"},
                   {"number": 2, "flags": "speculative off", "outcome": "verified", "measured": {}, "why": "verified"}]


def test_methods_are_the_stacks_values_with_off_first():
    assert M.parse_methods("mtp,dflash2") == ["off", "mtp", "dflash2"]
    assert M.parse_methods("ngram, off") == ["off", "ngram"]
    assert set(M.METHODS) == set(SPECULATIVE_MODES) - {"auto"}
    for bad, why in (("mtp,eagle", "eagle is not a method"), ("auto", "auto is not a method"),
                     ("mtp,mtp", "named twice"), ("off", "besides off")):
        with pytest.raises(b.BenchError, match=why):
            M.parse_methods(bad)


def test_methods_arguments_are_refused_before_any_host_is_touched():
    p = build_parser()
    assert check_methods_args(p.parse_args(["--methods", "ngram", "--inventory", "i.py", "--host", "h"])) == ["off", "ngram"]
    for argv, why in ((["--methods", "ngram", "--host", "h"], "needs --inventory"),
                      (["--methods", "ngram", "--inventory", "i.py", "--host", "h", "--ab", "a.json"], "neither --load"),
                      (["--methods", "ngram", "--inventory", "i.py", "--host", "h", "--api-key-file", "k"],
                       "drop --api-key-file")):
        with pytest.raises(b.BenchError, match=why):
            check_methods_args(p.parse_args(argv))
    assert cli.main(["bench", "--methods", "off,eagle", "--inventory", "i.py", "--host", "h"]) == 2


def test_the_report_says_what_ran_a_fallback_is_not_the_method_asked():
    one = M.deployed(_report(), "gpu-a", "mtp", 0)
    assert one.ok and one.ran == "mtp" and not one.fell_back and one.url == "http://10.0.0.5:8000"
    back = M.deployed(_report(attempts=NGRAM_FELL_BACK), "gpu-a", "ngram", 0)
    assert back.ok and back.ran == "off" and back.fell_back and back.flags == "speculative off"
    failed = M.deployed(_report(status="rolled back"), "gpu-a", "dflash2", 1)
    assert not failed.ok and failed.ran is None and failed.detail.startswith("rolled back")
    assert not M.deployed(None, "gpu-a", "mtp", 1).ok
    assert not M.deployed(_report(host="gpu-b"), "gpu-a", "mtp", 0).ok


def test_comparison_rows_ratios_against_off_and_acceptance():
    off = _run([_level(1, 0.4, 0.05), _level(4, 0.8, 0.08)])
    mtp = _run([_level(1, 0.5, 0.025, 70, 100), _level(4, 1.0, 0.05, 60, 100)], spec="on")
    comp = M.compare([{"method": "off", "deployed": {"ok": True, "ran": "off", "flags": "speculative off"}, "run": off},
                      {"method": "mtp", "deployed": {"ok": True, "ran": "mtp", "flags": "speculative mtp"}, "run": mtp}])
    rows = {(r["method"], r["concurrency"]): r for r in comp["rows"]}
    assert len(rows) == 4 and rows[("off", 1)]["decode_vs_off"] == 1.0 and rows[("off", 1)]["acceptance"] is None
    assert rows[("mtp", 1)]["decode_vs_off"] == pytest.approx(2.0)  # 40 tok/s vs 20
    assert rows[("mtp", 1)]["ttft_vs_off"] == pytest.approx(0.8)  # 0.4 s / 0.5 s: worse, below 1
    assert rows[("mtp", 1)]["acceptance"] == pytest.approx(0.7) and rows[("mtp", 4)]["acceptance"] == pytest.approx(0.6)
    text = M.format_comparison(comp, "gpu-a")
    assert "2.00x" in text and "70.0%" in text and "methods compared on gpu-a" in text
    assert not comp["warnings"]
    mtp["spec_counters_exported"] = False  # the report said mtp, the engine exports no spec counters
    comp = M.compare([{"method": "off", "deployed": {"ok": True, "ran": "off", "flags": "speculative off"}, "run": off},
                      {"method": "mtp", "deployed": {"ok": True, "ran": "mtp", "flags": "speculative mtp"}, "run": mtp}])
    assert comp["warnings"] == ["mtp: the report says speculative mtp, but the endpoint exports no spec-decode "
                                "counters: check its ExecStart"]


def test_comparison_marks_a_fallback_and_an_unmeasured_method():
    off = _run([_level(1, 0.4, 0.05)])
    comp = M.compare([
        {"method": "off", "deployed": {"ok": True, "ran": "off", "flags": "speculative off"}, "run": off},
        {"method": "ngram", "deployed": {"ok": True, "ran": "off", "flags": "speculative off", "detail": "below floor"},
         "run": _run([_level(1, 0.4, 0.05)])},
        {"method": "dflash2", "deployed": {"ok": False, "detail": "rolled back: x"}, "run": None,
         "error": "deploy did not verify: rolled back: x"}])
    text = M.format_comparison({**comp, "restore": {"ok": False, "detail": "pyinfra exit 1"}}, "gpu-a")
    assert "ngram -> off" in text and "fell back to off" in text
    assert "not measured: deploy did not verify" in text
    assert "RESTORE FAILED: gpu-a is NOT back" in text


class _Boom(Exception):
    pass


@pytest.mark.parametrize("fail_at", [None, "fallback", "bench", "deploy-raises"])
def test_run_methods_restores_the_host_last_whatever_happened(tmp_path, fail_at):
    calls = []
    off, ngram = _run([_level(1, 0.4, 0.05)]), _run([_level(1, 0.4, 0.03, 50, 90)], spec="on")

    def deploy(extra):
        calls.append(list(extra))
        if fail_at == "deploy-raises" and extra:
            raise _Boom("ssh dropped")
        attempts = NGRAM_FELL_BACK if extra == ["--data", "qwen27b_speculative=ngram"] and fail_at == "fallback" else None
        return 0, _report(attempts=attempts)

    seeds = []

    def bench(args):
        seeds.append((args.seed, args.spec, args.url, args.out.name))
        if fail_at == "bench" and args.spec == "on":
            raise b.BenchError("server went away")
        return ngram if args.spec == "on" else off

    args = argparse.Namespace(host="gpu-a", inventory="i.py", seed=None, url=None, out=tmp_path, spec="auto")
    if fail_at == "deploy-raises":
        with pytest.raises(_Boom):
            M.run_methods(args, ["off", "ngram"], deploy, bench, "10.0.0.5", say=lambda _: None)
        assert calls == [["--data", "qwen27b_speculative=off"], []]  # the restore ran anyway
        return
    result = M.run_methods(args, ["off", "ngram"], deploy, bench, "10.0.0.5", say=lambda _: None)
    assert calls == [["--data", "qwen27b_speculative=off"], ["--data", "qwen27b_speculative=ngram"], []]
    assert len({s[0] for s in seeds}) == 1 and seeds[0][0] is not None  # the same prompts for every method
    ngram_spec = "off" if fail_at == "fallback" else "on"  # benched as what runs, not as asked
    assert [s[1:] for s in seeds] == [("off", "http://10.0.0.5:8000", "off"), (ngram_spec, "http://10.0.0.5:8000", "ngram")]
    comp = result["comparison"]
    assert comp["restore"]["ok"]
    measured = [r["method"] for r in comp["rows"] if r["measured"]]
    assert measured == (["off"] if fail_at == "bench" else ["off", "ngram"])
    paths = M.write_comparison(result, tmp_path, b.write_outputs)
    saved = json.loads((tmp_path / "comparison.json").read_text())
    assert saved["methods"] == ["off", "ngram"] and (tmp_path / "off" / "bench.json") in paths
    if fail_at == "fallback":
        assert saved["entries"][1]["deployed"]["ran"] == "off" and "ngram -> off" in M.format_comparison(saved)
    if fail_at == "bench":
        assert "bench failed: server went away" in M.format_comparison(saved)


def test_a_failed_restore_is_said_and_fails(tmp_path):
    def deploy(extra):
        return (0, _report()) if extra else (1, _report(status="rolled back"))

    args = argparse.Namespace(host="gpu-a", inventory="i.py", seed=7, url=None, out=tmp_path, spec="auto")
    result = M.run_methods(args, ["off", "mtp"], deploy, lambda a: _run([_level(1, 0.4, 0.05)]), "10.0.0.5",
                           say=lambda _: None)
    assert not result["comparison"]["restore"]["ok"] and "pyinfra exit 1" in result["comparison"]["restore"]["detail"]


def test_wildcard_bind_is_reached_at_the_hosts_address():
    assert M.reachable("http://0.0.0.0:8000", "10.0.0.5") == "http://10.0.0.5:8000"
    assert M.reachable("http://10.0.0.9:8000", "10.0.0.5") == "http://10.0.0.9:8000"


def test_the_key_is_the_file_the_deploy_gives_the_host(tmp_path, monkeypatch):
    monkeypatch.setenv("QWEN27B_STATE_DIR", str(tmp_path / "state"))
    assert M.api_key_file({"qwen27b_api_key_file": "/etc/k"}, "i.py") == "/etc/k"
    assert M.api_key_file({"qwen27b_api_key_file": "none"}, "i.py") is None  # an open API
    assert M.api_key_file({}, "i.py") is None  # no lab key made yet: none to send
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "api.key").write_text("VLLM_API_KEY=sk-x\n")
    assert M.api_key_file({}, "i.py") == str(tmp_path / "state" / "api.key")


def test_cli_methods_prints_the_comparison_and_exits_by_the_restore(tmp_path, monkeypatch, capsys):
    import qwen27b.tools.bench.cli as bcli

    restore_code = {"rc": 0}

    def fake_deploy(inventory, host, deploy_file, reports):
        return lambda extra: (0, _report(host=host)) if extra else (restore_code["rc"], _report(host=host))

    monkeypatch.setattr(M, "host_data", lambda inv, host: ({"qwen27b_api_key_file": "/k"}, "10.0.0.5"))
    monkeypatch.setattr(M, "pyinfra_deploy", fake_deploy)
    keys = []
    monkeypatch.setattr(bcli, "measure", lambda a: keys.append(a.api_key_file) or _run([_level(1, 0.4, 0.05)]))
    argv = ["bench", "--methods", "ngram", "--inventory", "i.py", "--host", "gpu-a", "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 0 and keys == ["/k", "/k"]
    out = capsys.readouterr().out
    assert "methods compared on gpu-a" in out and "host restored" in out
    restore_code["rc"] = 1
    assert cli.main(argv) == 1 and "RESTORE FAILED" in capsys.readouterr().out
