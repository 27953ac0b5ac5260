"""qwen27b's own pyinfra operations, for what pyinfra 3.10 does not do (or does not do safely).

Written the way pyinfra writes its own (pyinfra/operations/apt.py, files.py): an `@operation()`
generator reads facts with `host.get_fact` and yields only the commands needed to reach the
desired state; when the state is already right it yields nothing and says why with `host.noop`.
Bad arguments raise OperationValueError before anything is yielded. Tests: one JSON file per
case in tests/operations/<op>/, run by tests/unit/test_operations.py.
"""

from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import re
import shlex

from pyinfra import host, state
from pyinfra.api import FileUploadCommand, StringCommand, operation
from pyinfra.api.exceptions import OperationError, OperationValueError

from qwen27b.controller import runstate
from qwen27b.controller.facts import HeldPackages
from qwen27b.controller.host_facts import DirectoryStates, FileHashes, SecretFileState, SymlinkTarget

_APT_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]*(?::[a-z0-9]+)?$")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_ACCOUNT = re.compile(r"^[a-z_][a-z0-9_-]*[$]?$")


@operation()
def apt_hold(packages: list[str], held: bool = True):
    """
    Hold (or, with ``held=False``, release) apt packages so upgrades leave them alone.

    + packages: package names, e.g. the driver, its DKMS/utils packages and the kernel image
    + held: ``True`` to ``apt-mark hold``, ``False`` to ``apt-mark unhold``

    Why: unattended-upgrades replacing the NVIDIA driver (or the kernel under its DKMS module) is
    the classic "driver lost after a reboot" on a working V100 box; the verified versions are
    held once installed. pyinfra 3.10 has no hold operation. Hold packages after installing them:
    apt-mark can set a hold on a package that is not installed, but `apt-mark showhold` may not
    list it, so the operation would hold it again on every run.
    """

    if isinstance(packages, str):
        packages = [packages]
    wanted = list(dict.fromkeys(packages))
    for package in wanted:
        if not isinstance(package, str) or not _APT_PACKAGE.match(package):
            raise OperationValueError(f"apt_hold: not an apt package name: {package!r}")

    currently_held = set(host.get_fact(HeldPackages))
    if held:
        change = [package for package in wanted if package not in currently_held]
        verb, already = "hold", "held"
    else:
        change = [package for package in wanted if package in currently_held]
        verb, already = "unhold", "not held"

    if not change:
        host.noop(f"apt packages already {already}: {', '.join(wanted) or '(none given)'}")
        return

    yield f"apt-mark {verb} {' '.join(change)}"


def _check_manifest(manifest: dict[str, str]) -> dict[str, str]:
    """Names become remote paths in dest_dir: nothing that could leave it, or hide from FileHashes."""
    if not isinstance(manifest, dict):
        raise OperationValueError(f"push_files: manifest must be a dict of name -> sha256, got {manifest!r}")
    checked = {}
    for name, digest in manifest.items():
        if (
            not isinstance(name, str)
            or not name
            or "/" in name
            or ".." in name
            or name.startswith(".")  # FileHashes skips hidden files: it would be re-sent every run
            or "\n" in name
            or "\0" in name
        ):
            raise OperationValueError(
                f"push_files: manifest name {name!r} is not a plain file name "
                "(no '/', '..', leading '.', newline or NUL)"
            )
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise OperationValueError(f"push_files: manifest sha256 for {name!r} is not 64 hex digits: {digest!r}")
        checked[name] = digest.lower()
    return checked


def _verify_then_rename(part: str, final: str, name: str, digest: str, mode: str, owner: str = "",
                        beside: str | None = None) -> str:
    # Hash the part from stdin, not with `sha256sum -c FILE-LIST`: the check file format escapes
    # names with a backslash or newline, so a plain comparison of the hex digest is simpler to trust.
    # rename(2) within one filesystem is atomic: readers see the old file or the verified new one.
    # `owner`: a part the SSH user uploaded (a sudo host's staging dir) becomes root's first.
    # `beside`: a part staged outside final's dir goes there first (hidden), then is renamed over final.
    q = shlex.quote
    before = f"push_files: {name}: uploaded sha256"
    after = f"is not the manifest sha256 {digest} (corrupt source file or transfer); {final} is unchanged"
    chown = f"chown {owner} {q(part)} && " if owner else ""
    move = (f"mv -f {q(part)} {q(beside)} && mv -f {q(beside)} {q(final)}" if beside
            else f"mv -f {q(part)} {q(final)}")
    return (
        f"h=$(sha256sum < {q(part)}) && h=${{h%% *}} && "
        f'if [ "$h" = {digest} ]; then {chown}chmod {mode} {q(part)} && {move}; '
        f"else rm -f {q(part)}; printf '%s %s %s\\n' {q(before)} \"$h\" {q(after)} >&2; exit 1; fi"
    )


@operation()
def push_files(
    src_dir: str,
    dest_dir: str,
    manifest: dict[str, str],
    remove_extra: bool = False,
    mode: str = "644",
):
    """
    Copy controller-side artifacts (the wheelhouse, model files) to a host, sending only the files
    that are missing there or differ from the manifest.

    + src_dir: controller directory holding the files (relative: to the deploy directory)
    + dest_dir: absolute directory on the host
    + manifest: ``{file name: sha256}``; names are plain file names directly in both directories
    + remove_extra: delete files in ``dest_dir`` that are not in the manifest (hidden files are
      never touched), before uploading, so a wheel of another version cannot be picked by pip and
      the space is free for the new files
    + mode: octal mode of the files sent (the connector's own choice differs: @local's is 600,
      which the service user could not read); files already matching are not re-moded

    Why: model files are many GiB and the hosts are many; `files.put` compares one file at a time
    and replaces the destination in place. Here the host's copy is judged by content (one
    `sha256sum` pass over the directory), each upload lands in ``NAME.part`` and is renamed over
    ``NAME`` only after its sha256 matches the manifest, so an interrupted or corrupt transfer
    (or a corrupt controller copy: the controller files are not re-hashed here) never replaces a
    good file and fails the operation naming the file. Under plain sudo the SSH user uploads into a
    staging dir it can reach (staging_dir) and root moves each verified file into place; an upload
    that fails tells the run summary why (CheckedUpload).
    """

    wanted = _check_manifest(manifest)
    if not isinstance(dest_dir, str) or not dest_dir.startswith("/"):
        raise OperationValueError(f"push_files: dest_dir must be an absolute path, got {dest_dir!r}")
    dest_dir = posixpath.normpath(dest_dir)
    if not isinstance(mode, str) or not re.fullmatch(r"[0-7]{3,4}", mode):
        raise OperationValueError(f"push_files: mode must be an octal string like '644', got {mode!r}")
    if not isinstance(src_dir, str) or not src_dir:
        raise OperationValueError(f"push_files: src_dir must be a directory path, got {src_dir!r}")
    if not os.path.isabs(src_dir) and state.cwd:
        src_dir = os.path.join(state.cwd, src_dir)

    present = host.get_fact(FileHashes, directory=dest_dir)
    send = [name for name in sorted(wanted) if present.get(name) != wanted[name]]
    extra = sorted(set(present) - set(wanted)) if remove_extra else []

    missing_locally = [name for name in send if not os.path.isfile(os.path.join(src_dir, name))]
    if missing_locally:
        raise OperationValueError(
            f"push_files: not in {src_dir} on the controller: {', '.join(missing_locally)}"
        )

    if not send and not extra:
        host.noop(f"{dest_dir}: all {len(wanted)} files match the manifest")
        return

    patient_rekey(getattr(host, "connector", None))  # test hosts have none
    if send and not present:
        yield f"mkdir -p {shlex.quote(dest_dir)}"  # FileHashes cannot tell missing from empty
    if extra:
        yield "rm -f " + " ".join(shlex.quote(posixpath.join(dest_dir, name)) for name in extra)
    # Under plain sudo, pyinfra's SSH connector uploads to /tmp and `cp`s into place: every byte
    # written twice (the 878 MiB wheelhouse, ~20% of a fresh deploy, issue 32). Instead the SSH user
    # uploads straight into a staging dir root made for it (0700, its own), as near the files as it
    # can reach (issue 48: the checkpoint's dir lies under /var/lib/qwen27b, 0750, which the SSH user
    # cannot traverse; staging there failed with Permission denied), and root renames each verified
    # file into place: on the same filesystem the rename is free.
    staging = None
    if send and _plain_sudo():
        staging = staging_dir(dest_dir, host.get_fact(DirectoryStates, paths=_levels(dest_dir)) or [])
        q = shlex.quote(staging)
        yield f'rm -rf {q} && mkdir -m 0700 {q} && chown "$SUDO_USER" {q}'
    op_hash = getattr(host, "current_op_hash", None)
    for name in send:
        final = posixpath.join(dest_dir, name)
        if staging:
            part = posixpath.join(staging, name + ".part")
            yield CheckedUpload(os.path.join(src_dir, name), part, op_hash=op_hash, _sudo=False)
            # staged outside dest_dir: moved beside the file first (a copy if another filesystem),
            # then renamed over it, so readers never see a partial file
            beside = None if posixpath.dirname(staging) == dest_dir else posixpath.join(dest_dir, f".{name}.part")
            yield _verify_then_rename(part, final, name, wanted[name], mode, owner="root:root", beside=beside)
        else:
            part = final + ".part"
            yield CheckedUpload(os.path.join(src_dir, name), part, op_hash=op_hash)
            yield _verify_then_rename(part, final, name, wanted[name], mode)
    if staging:
        yield f"rm -rf {shlex.quote(staging)}"


STAGING_DIR = ".incoming"  # hidden: FileHashes and remove_extra leave it alone
STAGING_PREFIX = ".qwen27b-incoming-"  # + a short id of the destination: a staging dir outside it


def _levels(path: str) -> list[str]:
    """"/var/lib/x" -> ["/", "/var", "/var/lib", "/var/lib/x"]."""
    levels, parts = ["/"], [part for part in path.split("/") if part]
    for n in range(1, len(parts) + 1):
        levels.append("/" + "/".join(parts[:n]))
    return levels


def staging_candidates(dest_dir: str) -> list[str]:
    """Every place push_files may stage uploads for `dest_dir` under plain sudo (staging_dir picks one):
    what a progress probe counts besides the destination while the files arrive."""
    dest_dir = posixpath.normpath(dest_dir)
    outside = STAGING_PREFIX + hashlib.sha256(dest_dir.encode()).hexdigest()[:12]
    return [posixpath.join(dest_dir, STAGING_DIR)] + [posixpath.join(level, outside) for level in _levels(dest_dir)[:-1]]


def staging_dir(dest_dir: str, states: list) -> str:
    """Where the SSH user uploads for `dest_dir` under plain sudo: `dest_dir/.incoming` when every
    directory down to it lets others search it (o+x: /opt/qwen27b/wheelhouse), else a hidden dir in
    the deepest such ancestor (/var/lib for the checkpoint under /var/lib/qwen27b, 0750). `states`:
    DirectoryStates of _levels(dest_dir). A level that is missing (made by this run's `mkdir -p`), not
    a directory (a symlink: its target's mode is unknown) or not searchable by others ends the walk:
    the SSH user may be neither its owner nor in its group."""
    levels = _levels(dest_dir)
    reached = "/"
    for level, state_now in zip(levels, states):
        if (state_now is None or state_now.get("type") != "directory"
                or not int(state_now.get("mode", "0"), 8) & 0o001):
            break
        reached = level
    candidates = staging_candidates(dest_dir)
    if reached == dest_dir:
        return candidates[0]
    return candidates[1 + levels.index(reached)]


class CheckedUpload(FileUploadCommand):
    """pyinfra's upload, whose failure the run summary can explain: the connector raises (an SFTP
    PermissionError, a full disk) and pyinfra logs one line but records no output for the operation,
    so the summary's detail was empty. The cause, with its fix, is kept for runsummary by host and
    operation (runstate.upload_errors)."""

    def __init__(self, src, dest, op_hash: str | None = None, **kwargs):
        super().__init__(src, dest, **kwargs)
        self.op_hash = op_hash

    def execute(self, state_now, host_now, connector_arguments):
        try:
            return super().execute(state_now, host_now, connector_arguments)
        except OSError as error:
            runstate.of(state_now).upload_errors[(host_now.name, self.op_hash)] = upload_failure(
                error, str(self.src), self.dest, getattr(host_now.data, "ssh_user", None))
            raise  # pyinfra logs it and fails the operation, as before


def upload_failure(error: OSError, src: str, dest: str, ssh_user: str | None) -> str:
    """One line for the run summary: which upload failed, why, and what to do."""
    cause = " ".join(str(error.strerror or error).split())  # @local's: cp's stderr, with its newline
    what = f"uploading {posixpath.basename(str(src))} to {dest} failed: {cause}"
    where = posixpath.dirname(dest)
    if isinstance(error, PermissionError):
        who = f"the SSH user {ssh_user}" if ssh_user else "the SSH user"
        return (f"{what}: {who} cannot write {where} or cannot reach it (a directory above it does not let "
                f"that user search it, e.g. mode 0750). Fix: make {where} writable and every directory above it "
                "searchable (o+x) for that user, or connect as root; then re-run")
    if error.errno == errno.ENOSPC:
        return f"{what}: free space on the host's filesystem of {where}, then re-run (files already verified stay)"
    return f"{what}: check {where} on the host, then re-run"


REKEY_WAIT_S = 300.0


def patient_rekey(connector, seconds: float = REKEY_WAIT_S) -> None:
    """paramiko re-keys an SSH connection every 512 MiB (packet.Packetizer.REKEY_BYTES) and a sender
    waits at most 30 s for the new keys (Transport.clear_to_send_timeout) before it raises
    "Key-exchange timed out waiting for key negotiation". Pushing the 878 MiB wheelhouse to a loaded
    host took longer once (the clean-clone CI of 2026-12-05, a test host's second fresh deploy): the
    operation failed, and pyinfra offers no setting for it. A bulk push lets the connection wait up to
    `seconds` instead. Other connectors (@local, @fake) have no paramiko transport: nothing to do."""
    client = getattr(connector, "client", None)
    transport = client.get_transport() if client is not None and hasattr(client, "get_transport") else None
    if transport is not None and getattr(transport, "clear_to_send_timeout", seconds) < seconds:
        transport.clear_to_send_timeout = seconds


def _plain_sudo() -> bool:
    """This operation runs through `sudo` as root (no other user, no su/doas): the SSH user can then
    write a staging dir that root gave it, and sudo names it in $SUDO_USER."""
    arguments = host.current_op_global_arguments or {}
    return bool(arguments.get("_sudo")) and not any(
        arguments.get(key) for key in ("_sudo_user", "_su_user", "_doas", "_dzdo"))


@operation()
def symlink_switch(link: str, target: str):
    """
    Point a symlink (the ``current`` release or model pointer) at ``target``, atomically.

    + link: the symlink's path on the host
    + target: what it should point to (written verbatim, relative or absolute)

    Why: the service follows ``current``; `ln -sfn` alone unlinks the old link and then creates
    the new one, so a restart in between finds no ``current``. Building ``LINK.new`` and renaming
    it over ``LINK`` (rename(2) is atomic) means every reader sees the old or the new target.
    A real directory at ``LINK`` is not replaced: `mv -T` refuses it and the operation fails.
    """

    if not isinstance(link, str) or not link.strip("/"):
        raise OperationValueError(f"symlink_switch: link must be a path, got {link!r}")
    if not isinstance(target, str) or not target or "\n" in target or "\0" in target:
        raise OperationValueError(f"symlink_switch: target must be a path, got {target!r}")
    link = posixpath.normpath(link)

    if host.get_fact(SymlinkTarget, path=link) == target:
        host.noop(f"{link} already points to {target}")
        return

    staged = shlex.quote(link + ".new")
    yield f"ln -sfn {shlex.quote(target)} {staged} && mv -Tf {staged} {shlex.quote(link)}"


@operation()
def directories(specs: list[list[str]], hints: dict | None = None):
    """
    Make each directory exist with its owner, group and mode.

    + specs: ``[[path, user, group, mode], ...]``, parents before children; mode octal, e.g. ``"0750"``
    + hints: ``{path: text}`` added to the failure where that path is not a directory (the way that works)

    Why: `files.directory` reads its own fact once to plan and again to execute; the layout's
    eight directories cost sixteen remote commands (and eight operations of controller time) on
    every no-op run. Here one `stat` per run answers for all of them. A path that exists but is
    not a directory fails the operation, naming it (pyinfra's op does the same).
    """

    checked = []
    for spec in specs:
        if not isinstance(spec, (list, tuple)) or len(spec) != 4 or not all(isinstance(v, str) for v in spec):
            raise OperationValueError(f"directories: each spec is [path, user, group, mode], got {spec!r}")
        path, user, group, mode = spec
        if not path.startswith("/") or "\n" in path or "\0" in path:
            raise OperationValueError(f"directories: path must be absolute, got {path!r}")
        if not _ACCOUNT.match(user) or not _ACCOUNT.match(group):
            raise OperationValueError(f"directories: {path}: not a user/group name: {user!r}:{group!r}")
        if not re.fullmatch(r"[0-7]{3,4}", mode):
            raise OperationValueError(f"directories: {path}: mode must be octal like '0755', got {mode!r}")
        checked.append((posixpath.normpath(path), user, group, mode))

    states = host.get_fact(DirectoryStates, paths=[path for path, *_ in checked])
    states = states if states is not None else [None] * len(checked)
    if len(states) != len(checked):
        raise OperationError(f"directories: {len(states)} answers for {len(checked)} paths")
    commands = []  # all checked before the first is yielded: a bad path fails the op before any change
    for (path, user, group, mode), now in zip(checked, states):
        q = shlex.quote(path)
        if now is not None and now["type"] != "directory":
            hint = (hints or {}).get(path)
            raise OperationError(f"directories: {path} exists and is a {now['type']}, not a directory: move it away"
                                 + (f"; {hint}" if hint else ""))
        if now is None:
            commands.append(f"mkdir -p {q}")
        if now is None or (now["user"], now["group"]) != (user, group):
            commands.append(f"chown {user}:{group} {q}")
        if now is None or int(now["mode"], 8) != int(mode, 8):
            commands.append(f"chmod {mode} {q}")
    if not commands:
        host.noop(f"all {len(checked)} directories in place (owner, group, mode)")
    yield from commands


@operation()
def secret_file(dest: str, content: str, user: str = "root", group: str = "root", mode: str = "0600"):
    """
    Write a secret (an API key env file, a hub token) to a host without it showing anywhere.

    + dest: absolute path on the host; its directory must exist and be writable only by root
    + content: the file's text (the secret)
    + user, group, mode: the file's owner and octal mode (default root:root 0600)

    Why: `files.put` prints a new file's contents with `--diff`, and on a change reads the old
    file back and prints the diff (the old key); with `_sudo` it stages the upload in a predictable
    temp path created with the login user's umask (world-readable) before the chmod. Here the host's
    copy is judged by its sha256 only (SecretFileState), and the content travels on the command's
    stdin (pyinfra's `_stdin`: never in a command line, a plan line, `-v` output or `ps`) into
    ``.NAME.part`` next to ``dest``, created under umask 077, owned and moded, then renamed over
    ``dest`` (rename(2): readers see the old file or the new one, never a partial or open one).
    """

    if not isinstance(dest, str) or not dest.startswith("/") or "\n" in dest or "\0" in dest:
        raise OperationValueError(f"secret_file: dest must be an absolute path, got {dest!r}")
    if not isinstance(content, str):
        raise OperationValueError(f"secret_file: content must be text, got {type(content).__name__}")
    if not _ACCOUNT.match(user) or not _ACCOUNT.match(group):
        raise OperationValueError(f"secret_file: {dest}: not a user/group name: {user!r}:{group!r}")
    if not isinstance(mode, str) or not re.fullmatch(r"[0-7]{3,4}", mode):
        raise OperationValueError(f"secret_file: mode must be an octal string like '0600', got {mode!r}")
    dest = posixpath.normpath(dest)
    want = hashlib.sha256(content.encode()).hexdigest()
    now = host.get_fact(SecretFileState, path=dest)
    q = shlex.quote(dest)
    if now is not None and now["sha256"] == want:
        fixes = []
        if (now["user"], now["group"]) != (user, group):
            fixes.append(f"chown {user}:{group} {q}")
        if int(now["mode"], 8) != int(mode, 8):
            fixes.append(f"chmod {mode} {q}")
        if not fixes:
            host.noop(f"{dest}: content (sha256), owner and mode already right")
        yield from fixes
        return
    part = shlex.quote(posixpath.join(posixpath.dirname(dest), "." + posixpath.basename(dest) + ".part"))
    yield StringCommand(
        f"umask 077 && rm -f {part} && cat > {part} && chown {user}:{group} {part} && chmod {mode} {part} "
        f"&& mv -fT {part} {q}",
        _stdin=content,
    )
