"""doctor's report model: the verdicts, a host's snapshot (what was read, saved and replayed as
one file per key) and the report of checks it is judged into."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from qwen27b.onhost.contract import SERVICE_UNIT
from qwen27b.plan.copykeys import INSTANCE_NAME, INSTANCES_KEY
from qwen27b.plan.settings import OPEN_API
from qwen27b.plan.urlsecret import URL_KEYS, redact_url

from .journal import compact_journal_json
from .parse import METRIC_FAMILIES

UNIT = SERVICE_UNIT
OK, WARN, FAIL, SKIP, INFO = "ok", "warn", "fail", "skip", "info"
RANK = {SKIP: 0, INFO: 1, OK: 2, WARN: 3, FAIL: 4}  # info: history, not a judgement (counts as ok)
STEPS = {1: "symptom", 2: "inputs", 3: "environment", 4: "parameters", 5: "tool limits"}
# A host serving copies (qwen27b_instances): these keys are read per copy, as `STEM@NAME.EXT`
# (journal@b.json); the rest (model, venv, facts, nvidia-smi) is the host's, shared by its copies.
COPY_KEYS = ("systemctl-show.txt", "journal.txt", "journal.json", "health.txt", "metrics.txt")
COPIES_KEY = "copies.txt"  # the copies enabled on the host, one name a line (collection.COPIES_COMMAND)
CHAT_PAGE_KEY = "chat-page.txt"  # a gateway host's chat page: unit, /health, journal (gateway.chat_page_command)
COPY_ENV = "env.txt"  # a copy's env file: its GPUs (CUDA_VISIBLE_DEVICES) and flags (QWEN27B_SERVE_ARGS)


def copy_unit(name: str) -> str:
    """A copy's unit, as roles/service.py starts it (controller.render_copies.instance_unit)."""
    return f"qwen27b@{name}.service"


def copy_key(key: str, name: str) -> str:
    """The snapshot key of a copy's own output: journal.json -> journal@b.json."""
    stem, dot, ext = key.rpartition(".")
    return f"{stem}@{name}{dot}{ext}"


def plain_key(key: str) -> str:
    """journal@b.json -> journal.json (what a key holds, whichever copy it is of)."""
    stem, dot, ext = key.rpartition(".")
    return f"{stem.split('@', 1)[0]}{dot}{ext}" if "@" in stem else key


#: A saved snapshot's value for a controller-side secret file: the deploy had one, its path and
#: contents stayed behind (context.Ctx plans with it as the deploy did, without reading it).
KEPT_ON_CONTROLLER = "(kept on the controller)"
SECRET_FILE_KEYS = ("qwen27b_api_key_file", "qwen27b_hf_token_file")


@dataclass
class HostSnapshot:
    """What doctor read from one host: command outputs by key (see collection.commands), their exit codes,
    and the host's inventory data (qwen27b_* keys, ssh_hostname). A key that is absent was not
    collected (its checks are skipped); `error` is set when the host could not be read at all."""

    host: str
    outputs: dict[str, str] = field(default_factory=dict)
    codes: dict[str, int] = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    error: str | None = None
    reached: str | None = None  # the address the SSH connection reached (the plan's bind address without one in data)
    copy: str | None = None  # set on a copy's view of its host's snapshot (for_copy)
    gateway: bool = False  # a host of the qwen27b_gateway group: judged by doctor/gateway.py, not the serving chain

    @property
    def unit_name(self) -> str:
        return copy_unit(self.copy) if self.copy else UNIT

    def copy_names(self) -> list[str]:
        """The copies this host serves: the inventory's qwen27b_instances (in its order), then any
        other copy still enabled on the host (dropped from the inventory, still running)."""
        listed = [i.get("name") for i in (self.data or {}).get(INSTANCES_KEY) or [] if isinstance(i, dict)]
        found = (self.text(COPIES_KEY) or "").split()
        out: list[str] = []
        for name in listed + found:
            if isinstance(name, str) and INSTANCE_NAME.match(name) and name not in out:
                out.append(name)
        return out

    def for_copy(self, name: str) -> "HostSnapshot":
        """One copy's view: its unit, journal, /health and /metrics in the keys the steps read; the
        host's files (model, venv, facts) as they are; a key the copy lacks is absent, never the host's."""
        outputs = {k: v for k, v in self.outputs.items() if k not in COPY_KEYS}
        codes = {k: v for k, v in self.codes.items() if k not in COPY_KEYS}
        for key in COPY_KEYS + (COPY_ENV,):
            own = copy_key(key, name)
            if own in self.outputs:
                outputs[key] = self.outputs[own]
            if own in self.codes:
                codes[key] = self.codes[own]
        return HostSnapshot(host=self.host, outputs=outputs, codes=codes, data=self.data, error=self.error,
                            reached=self.reached, copy=name)

    def text(self, key: str) -> str | None:
        return self.outputs.get(key)

    def ok_text(self, key: str) -> str | None:
        """The output, or None when the key is absent or its command failed."""
        if key not in self.outputs or self.codes.get(key, 0) != 0:
            return None
        return self.outputs[key]

    def save(self, directory: Path) -> None:
        """One file per key (the layout `load` reads); /metrics is cut to the families doctor reads."""
        directory.mkdir(parents=True, exist_ok=True)
        for key, text in self.outputs.items():
            if plain_key(key) == "metrics.txt":
                text = "\n".join(line for line in text.splitlines() if any(f in line for f in METRIC_FAMILIES))
            elif plain_key(key) == "journal.json":
                text = compact_journal_json(text)
            (directory / key).write_text(text + ("\n" if text and not text.endswith("\n") else ""), encoding="utf-8")
        # the host data that drives decisions (URL passwords as ***); a controller-side secret file
        # is kept as the fact that there was one (the plan's route guard comes with the API key)
        data = {k: redact_url(v) if isinstance(v, str) and k[len("qwen27b_"):] in URL_KEYS else v
                for k, v in self.data.items() if k.startswith(("qwen27b_", "ssh_hostname"))}
        for key in SECRET_FILE_KEYS:
            if data.get(key) not in (None, OPEN_API):
                data[key] = KEPT_ON_CONTROLLER
        meta = {"host": self.host, "codes": {k: v for k, v in self.codes.items() if v}, "error": self.error,
                "data": data, "reached": self.reached, **({"gateway": True} if self.gateway else {})}
        (directory / "snapshot.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, directory: Path | str) -> "HostSnapshot":
        """A saved or hand-written snapshot dir: one file per key, optional snapshot.json
        {host, codes, data, error, absent: [keys]} and an optional `base` file naming another
        snapshot (or a tests/fixtures/hosts/ recording) whose files fill in the keys this one lacks."""
        directory = Path(directory)
        meta_file = directory / "snapshot.json"
        meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
        base_file = directory / "base"
        if base_file.is_file():
            base = cls.load((directory / base_file.read_text().strip()).resolve())
        else:
            base = cls(host=directory.name)
        outputs, codes = dict(base.outputs), dict(base.codes)
        for path in sorted(directory.iterdir()):
            if path.is_file() and path.name not in ("snapshot.json", "base", "README.md", "extra.yaml",
                                                    "record_state.py"):
                outputs[path.name] = path.read_text(encoding="utf-8").rstrip("\n")
                codes.pop(path.name, None)
        for key in meta.get("absent", []):
            outputs.pop(key, None)
        codes.update(meta.get("codes", {}))
        data = {**base.data, **meta.get("data", {})}
        return cls(host=meta.get("host") or base.host or directory.name, outputs=outputs, codes=codes, data=data,
                   error=meta.get("error"), reached=meta.get("reached", base.reached),
                   gateway=bool(meta.get("gateway", base.gateway)))


@dataclass
class Check:
    step: int
    check: str
    verdict: str
    evidence: str
    fix: str = ""

    @property
    def step_name(self) -> str:
        return STEPS[self.step]


@dataclass
class Report:
    host: str
    checks: list[Check]
    symptom: dict = field(default_factory=dict)
    # a host serving copies (qwen27b_instances): the whole chain per copy, by name; `checks` stays empty
    copies: dict[str, "Report"] = field(default_factory=dict)
    unit: str = UNIT

    @property
    def failing_copy(self) -> str | None:
        return next((name for name, r in self.copies.items() if r.first_failure is not None), None)

    @property
    def first_failure(self) -> Check | None:
        """The first failing cause step in chain order (2..5); step 1 when nothing explains it. On a
        host serving copies: the first failing copy's."""
        if self.copies:
            name = self.failing_copy
            return None if name is None else self.copies[name].first_failure
        fails = [c for c in self.checks if c.verdict == FAIL]
        causes = [c for c in fails if c.step > 1]
        pool = causes or fails
        return min(pool, key=lambda c: c.step) if pool else None

    @property
    def status(self) -> str:
        verdicts = [c.verdict for c in self.checks] + [r.status for r in self.copies.values()]
        worst = max(verdicts, key=RANK.get, default=OK)
        return OK if worst == INFO else worst

    def headline(self) -> str:
        if self.copies:  # one clause per copy, in the inventory's order; each copy's own headline has the evidence
            return "doctor: " + "; ".join(f"copy {name}: {r.verdict_in_brief()}" for name, r in self.copies.items())
        first = self.first_failure
        if first is not None:
            text = f"doctor: step {first.step} ({first.step_name}) fails: {first.check}: {first.evidence}"
            if first.step > 1 and self.symptom.get("state") not in (None, "serving"):
                text += f" [symptom: {self.symptom['summary']}]"
            return text
        warns = [c for c in self.checks if c.verdict == WARN]
        if warns:
            w = warns[0]
            return (f"doctor: no step fails; {len(warns)} warning(s), first: step {w.step} ({w.step_name}) "
                    f"{w.check}: {w.evidence}")
        return f"doctor: all {sum(c.verdict == OK for c in self.checks)} checks ok"

    def verdict_in_brief(self) -> str:
        first = self.first_failure
        if first is not None:
            return f"step {first.step} ({first.step_name}) fails: {first.check}"
        warns = sum(c.verdict == WARN for c in self.checks)
        return f"{warns} warning(s)" if warns else "ok"

    def as_dict(self) -> dict:
        first = self.first_failure
        out = {
            "host": self.host,
            "unit": self.unit,
            "status": self.status,
            "headline": self.headline(),
            "first_failure": None if first is None else {**asdict(first), "step_name": first.step_name},
            "symptom": self.symptom,
            "checks": [{**asdict(c), "step_name": c.step_name} for c in self.checks],
        }
        if self.copies:
            out["first_failure"] = out["first_failure"] and {**out["first_failure"], "copy": self.failing_copy}
            out["copies"] = {name: r.as_dict() for name, r in self.copies.items()}
        return out

# what doctor reads of a unit (systemctl show -p ...): its state, its last exit, where it comes from
SHOW_PROPS = ("LoadState", "ActiveState", "SubState", "Result", "NRestarts", "ExecMainStatus", "ExecMainCode", "MainPID",
              "FragmentPath", "DropInPaths", "ActiveEnterTimestamp", "StateChangeTimestamp", "InvocationID", "ExecStart")
