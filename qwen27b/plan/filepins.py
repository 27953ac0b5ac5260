"""Every checkpoint file checked against its pinned sha256 before the model link switches.

The stack file pins a checkpoint's files where someone published them (stack key `models.<name>.files`):

    files: {source: [source-id], list: {"config.json": {size: 1234, sha256: "<64 hex>"}, ...}}

`sha256: null` (or a checkpoint without `files:`) is a file nobody published a hash for: the plan
says so, file by file, and that file is checked only against what its source lists (the mirror's
manifest, the hub's own listing). The pins describe the entry's own revision (the hub's `revision`
or ModelScope's `modelscope.revision`): a host that pins another revision
(qwen27b_stack_overrides {"model_revision": ...}) gets no check, and the plan says why.

Two checks of the same rule (a pinned file present, of its size, of its sha256; one line per file
that is not, expected vs got):
- on the controller, before any byte lands on a host: the mirror's manifest and a pushed local
  dir's own hashes against the pins (`source_problems`); a file that differs is never fetched into
  the host's model dir, which may be the one the service is serving;
- on the host, after the files arrived by whatever route (hub or ModelScope download, mirror
  fetch, controller push, a peer's fan-out) and before the link switches (`check_command`, the one
  shared command builder): a mismatch exits non-zero naming each file (expected vs got), so the
  deploy stops there, the link and the serving release untouched, and the run summary's last line
  says what to do. The weights role queues it where bytes may arrive or the link will switch; a
  run that changes neither (the link already on a dir that was checked when it switched) skips it.

Not re-hashing gigabytes on every run (qwen27b_onhost.pincheck): a file is hashed only when its identity
changed since it was last hashed. Identity is (size, mtime, ctime, inode), the stat cache that the
FileHashes fact keeps in the same dir (host_facts.HASH_CACHE: written only for files unchanged for
2 s, and any write changes ctime, which no user can set), or, for a file the cache does not know
yet, the manifest written right after a hub/ModelScope download (hubdownload.HUB_MANIFEST) when that
manifest is newer than the file's mtime and ctime (the file has not changed since it was hashed for
it). The check writes what it hashed into the stat cache, so a second run with good files stats
each file and hashes nothing.
"""

from __future__ import annotations

import json
import re
import shlex

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")  # a plain file name directly in the model dir
SHA256 = re.compile(r"[0-9a-f]{64}")


class PinError(ValueError):
    """A `files:` table that breaks the schema (names the entry and the key)."""


def validate(key: str, entry: dict, sources: dict) -> None:
    """Refuse a malformed `files:` of models.<key>: the names reach a host's command line."""
    files = entry.get("files")
    if files is None:
        return
    where = f"models.{key}.files"
    if not isinstance(files, dict) or set(files) != {"source", "list"} or not isinstance(files["list"], dict):
        raise PinError(f"{where}: expected {{source: [source-id], list: {{name: {{size: N, sha256: '<64 hex>'}}}}}}")
    cited = files["source"] if isinstance(files["source"], list) else [files["source"]]
    for source in cited:
        if source not in sources:
            raise PinError(f"{where}.source: '{source}' is not a key of sources:")
    for name, meta in files["list"].items():
        if not isinstance(name, str) or not NAME.fullmatch(name) or ".." in name:
            raise PinError(f"{where}.list: {name!r} is not a plain file name ({NAME.pattern})")
        if not isinstance(meta, dict) or set(meta) != {"size", "sha256"}:
            raise PinError(f"{where}.list.{name}: expected {{size: N, sha256: '<64 hex>' or null}}")
        if not isinstance(meta["size"], int) or isinstance(meta["size"], bool) or meta["size"] < 0:
            raise PinError(f"{where}.list.{name}.size: {meta['size']!r} is not a byte count")
        if meta["sha256"] is not None and not (isinstance(meta["sha256"], str) and SHA256.fullmatch(meta["sha256"])):
            raise PinError(f"{where}.list.{name}.sha256: {meta['sha256']!r} is not 64 lowercase hex digits (or null)")


def for_revision(entry: dict, own: dict) -> dict:
    """`entry` as resolved (overrides merged), its `files` kept only while it is still the revision
    they describe (`own`: the stack's entry on the same source); else `files_off` says why."""
    if not entry.get("files") or entry.get("revision") == own.get("revision"):
        return entry
    out = {key: value for key, value in entry.items() if key != "files"}
    out["files_off"] = (f"the pinned sha256 are for revision {own.get('revision')}, this host fetches "
                        f"{entry.get('revision')} (qwen27b_stack_overrides)")
    return out


def pins(entry: dict | None) -> dict[str, dict]:
    """{name: {size, sha256}} of the files with a published sha256 ({} when none apply)."""
    files = (entry or {}).get("files") or {}
    return {name: dict(meta) for name, meta in sorted((files.get("list") or {}).items()) if meta.get("sha256")}


def unpinned(entry: dict, listed: list[str]) -> list[str]:
    """The names of `entry`'s files that no pin covers: its `files:` entries with sha256 null, or,
    without `files:`, every file its metadata lists (`listed`: config.json, the weight shards)."""
    if entry.get("files"):  # the published list is the checkpoint's own (metadata may be constructed)
        return sorted(name for name, meta in entry["files"]["list"].items() if not meta.get("sha256"))
    return sorted(listed)


def choice_note(entry: dict, cite) -> str:
    """The plan's word on the model/draft row: how its files are checked."""
    pinned = pins(entry)
    if pinned:
        return (f"; {len(pinned)} files pinned by sha256, checked on the host before the link switches "
                f"{cite(entry['files']['source'])}")
    if entry.get("files_off"):
        return f"; files not checked against pins: {entry['files_off']}"
    return ""


def plan_warnings(what: str, entry: dict, listed: list[str]) -> list[str]:
    """One warning per file of `entry` without a published sha256 (`listed`: the files its metadata
    names), as the plan says for every other unpinned artifact."""
    if entry.get("files_off"):
        return []
    return [f"{what} {entry['id']}@{entry['revision']}: {name} has no published sha256 in the stack file: it is "
            f"checked only against its source's own listing; pin it (stack key models[].files.list)"
            for name in unpinned(entry, listed)]


def mismatches(have: dict[str, dict], pinned: dict[str, dict]) -> list[str]:
    """One line per pinned file that `have` ({name: {size?, sha256}}) lacks or lists otherwise:
    the rule both checks share. Files `have` lists beyond the pins are not judged here."""
    out = []
    for name, pin in sorted(pinned.items()):
        got = have.get(name)
        if got is None:
            out.append(f"{name}: missing (expected {pin['size']} bytes, sha256 {pin['sha256']})")
        elif got.get("size") is not None and int(got["size"]) != pin["size"]:
            out.append(f"{name}: {got['size']} bytes, expected {pin['size']} (sha256 {pin['sha256']})")
        elif got.get("sha256") != pin["sha256"]:
            out.append(f"{name}: sha256 {got.get('sha256')}, expected {pin['sha256']}")
    return out


def source_problems(where: str, entry: dict, have: dict[str, dict]) -> str | None:
    """The controller's check of a source's listing (a mirror's manifest, a local dir's hashes)
    before anything is fetched: None when every pinned file is listed as pinned, else the
    OperationError text naming each file and what to do."""
    bad = mismatches(have, pins(entry))
    if not bad:
        return None
    return (f"{where} does not hold {entry['id']}@{entry['revision']} as pinned in the stack file "
            f"({'; '.join(bad)}): nothing was fetched, the model link and the serving release are untouched; "
            f"fix: rebuild that copy from the pinned revision (or pin another revision with "
            f"qwen27b_stack_overrides and its own files)")


def route_words(source: str, mirror: str, hub_manifest: str) -> str:
    """Where the files came from and how to fetch them again, for the on-host check's last line."""
    if source == "mirror":
        return f"the mirror {mirror} (or a peer's fan-out copy)"
    if source in ("hub", "modelscope"):
        return (f"the {'ModelScope' if source == 'modelscope' else 'hub'} download (remove {hub_manifest} too, "
                "or the next run will not download again)")
    return "the controller's push"


def check_command(tool: str, target: str, pins_file: str, route: str, hash_cache: str, hub_manifest: str) -> str:
    """The on-host check (qwen27b_onhost.pincheck, run as `tool`) of the files pinned in `pins_file`
    (pins_json, pushed beside) in `target`, before the model link switches. `route` says in the
    failure's last line where the files came from: the link was not switched, the serving release is
    untouched, and what to do."""
    fix = (f"the model link was not switched and the serving release is untouched; these came from {route}: "
           f"remove the files named above from {target} (or the whole dir, if nothing serves it) and deploy again "
           f"to fetch them anew, and fix that source if it serves them again")
    return (f"{tool} --dir {shlex.quote(target)} --pins {shlex.quote(pins_file)} --stat-cache {shlex.quote(hash_cache)} "
            f"--listing {shlex.quote(hub_manifest)} --fix {shlex.quote(fix)}")


def pins_json(entry: dict) -> str:
    """The pins file the check reads: {name: {size, sha256}}."""
    return json.dumps(pins(entry), sort_keys=True, indent=1) + "\n"


def listed_files(metadata_dir) -> list[str]:
    """The files a checkpoint's metadata (qwen27b/plan/checkpoints/<dir>) names: config.json and
    the weight files of its safetensors index (model.safetensors when the index maps none)."""
    from pathlib import Path  # noqa: PLC0415

    try:
        index = json.loads((Path(metadata_dir) / "model.safetensors.index.json").read_text())
        weights = set((index.get("weight_map") or {}).values())
    except (OSError, ValueError, AttributeError):
        weights = set()
    return sorted({"config.json"} | (weights or {"model.safetensors"}))


def hash_policy(setting: bool | None, profile: dict) -> tuple[bool, bool]:
    """(required, by_default) for qwen27b_require_hashes: the host's value, else the profile's
    `require_hashes` (sm70: true, its engine wheel is pinned). By default only what the stack itself
    pins is held to it (the engine wheel's sha256); the host's explicit true also refuses what only a
    wheelhouse could pin (installs.unpinned)."""
    if setting is not None:
        return setting, False
    return bool(profile.get("require_hashes")), True


def hash_choice(setting: bool | None, profile: dict, cite) -> tuple[str, str] | None:
    """The plan's `hashes` row (value, reason), or None when nothing is required."""
    required, by_default = hash_policy(setting, profile)
    if not required:
        return None
    if by_default:
        return ("required (profile default)",
                f"the engine wheel and checkpoint files, by their pinned sha256 {cite(profile.get('require_hashes_source'))}")
    return ("required (host data)", "every artifact pinned by sha256, dependencies from a wheelhouse")
