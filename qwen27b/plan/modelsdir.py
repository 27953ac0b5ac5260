"""Models on the big disk (issue 52 item 4): host data `qwen27b_models_dir` puts the model revisions
(and the `current` / `draft` links the service reads) in a directory of the lab's choosing, e.g.
`/data/qwen27b/models` where `/var` is a small volume. The stack's `paths.models` and
`paths.current_model` are replaced for that host (`with_models_dir`) before the HostLayout is made
from them, so every role, fact (DiskFree, ModelsOnDisk), unit and the uninstall ask one place.

Why a setting, not a symlink at the models path: the models path lies in the service's state dir,
which the service user owns; a link there is a level that user could point elsewhere, and the
weights role (root) writes, prunes and chowns through it. The models dir the setting names is made
root:qwen27b 0750 by the toolchain role like the default one, outside every service-writable dir
(checked here). A bind mount of a big-disk directory at the default models path also works unchanged
(the path stays a real directory and `df` measures the mounted disk); the disk refusal names both.

Pure: host data in, refusals (BadHostData, host/key/fix) out, before any host is touched.
"""

from __future__ import annotations

import re

from qwen27b.plan.hostlayout import HostLayout, with_models_dir  # noqa: F401 (with_models_dir: its importers)
from qwen27b.plan.settings import BadHostData

KEY = "qwen27b_models_dir"
# letters, digits and . _ - in each level: the path reaches shells (quoted) and unit files unquoted
_LEVEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# System trees, and the ones the units' sandbox hides from the service (ProtectHome=yes: /home,
# /root, /run/user) or that are not kept across a reboot (/tmp, /run)
_SYSTEM = ("/proc", "/sys", "/dev", "/run", "/tmp", "/var/tmp", "/boot", "/etc", "/usr", "/bin", "/sbin",
           "/lib", "/lib32", "/lib64", "/home", "/root", "/snap", "/lost+found")
EXAMPLE = "/data/qwen27b/models"
DISK_FIX = (f"set {KEY} to a directory on a larger disk (e.g. {EXAMPLE}; a symlink at the models path is "
            "refused), or bind-mount one at the models path")


def _under(path: str, top: str) -> bool:
    top = top.rstrip("/")
    return path == top or path.startswith(top + "/")


def check_models_dir(host: str, value: str, paths: dict) -> str:
    """The models dir host data names, checked against the stack's `paths` -> the path to use."""
    fix = f"give an absolute path on the big disk, a directory of its own, e.g. {EXAMPLE}"
    if not value.startswith("/"):
        raise BadHostData(host, KEY, f"{value!r} is not an absolute path", fix)
    levels = value.rstrip("/").split("/")[1:]
    bad = [level for level in levels if not _LEVEL.match(level)]
    if bad or not levels:
        raise BadHostData(host, KEY, f"{value!r}: each level takes letters, digits and . _ - (not starting with . _ -), "
                          f"not {bad[0] if bad else '/'!r}", fix)
    path = "/" + "/".join(levels)
    if len(levels) < 2:
        raise BadHostData(host, KEY, f"{path} is a top-level directory: the deploy owns the models dir (root:qwen27b "
                          "0750), prunes old revisions in it and the uninstall may remove it", fix)
    at = HostLayout.of(paths)
    if path == at.models:
        return path
    for top, what in ((at.state, "the service's state dir, which the service user owns and can write"),
                      (at.cache, "the service's cache dir, which the service user owns and can write"),
                      (at.root, "the deploy's own tree (uninstall removes it)"),
                      (at.config, "the deploy's config dir (uninstall removes it)")):
        if _under(path, top) or _under(top, path):
            raise BadHostData(host, KEY, f"{path} is in or holds {top}, {what}", fix)
    for top in _SYSTEM:
        if _under(path, top):
            raise BadHostData(host, KEY, f"{path} is under {top}: a system directory, or one the service's sandbox hides "
                              "(ProtectHome=yes) or a reboot empties", fix)
    return path


def models_reason(paths: dict, models_dir: str | None) -> str:
    """The plan's word on where the weights land."""
    default = HostLayout.of(paths).models
    if not models_dir or models_dir == default:
        return ""
    return (f"model revisions in {models_dir} ({KEY}), not {default}: the service reads "
            f"{models_dir}/current; the disk check measures there")


def apart_from_state(paths: dict) -> bool:
    """Whether the models dir lies outside the state dir (qwen27b_models_dir)."""
    at = HostLayout.of(paths)
    return not at.models.startswith(at.state.rstrip("/") + "/")


def uninstall_apart(have: dict, models: str, links: list[str], weights: bool) -> tuple[list[tuple], list[str]]:
    """The uninstall's word on a models dir outside the state dir (`have`: path -> 'owner:group' of
    what is there): ([(what, why, commands)], kept). With qwen27b_uninstall_weights it goes whole;
    else the service's links in it go and the dir is root's (the service user is removed)."""
    import shlex
    q = shlex.quote
    if models not in have:
        return [], []
    if weights:
        return [(f"{models} with the model weights", f"every model revision ({KEY})", (f"rm -rf {q(models)}",))], []
    out = []
    there = [link for link in links if link in have]
    if there or have[models] != "root:root":
        out.append((f"{', '.join(there) + ' in ' if there else ''}{models}: handed to root",
                    "the service's links go; the weights stay (qwen27b_uninstall_weights=true removes them), owned by "
                    "root from now on",
                    (*([f"rm -f {' '.join(q(link) for link in there)}"] if there else []),
                     f"if [ -L {q(models)} ] || [ ! -d {q(models)} ]; then echo {q(models + ' is not a directory (a symbolic link?): left as it is; check who made it and remove it by hand')} >&2; "
                     f"exit 1; fi; chown -h root:root {q(models)} && chmod 0755 {q(models)}")))
    return out, [f"{models}: the model weights ({KEY}; set qwen27b_uninstall_weights=true to remove them; "
                 "a later deploy uses them again instead of fetching)"]


# The directories op's word where the models path is a link (the lab's usual fix for a small /var):
# root does not write weights through a link in the service user's state dir
MODELS_LINK_HINT = (f"a symbolic link there is not followed (it sits in the service user's state dir): set {KEY} to "
                    "the directory it points at (the weights already there are used), or bind-mount that directory at "
                    "the models path")


def host_paths(paths: dict, host: str, data: dict) -> dict:
    """`paths` with a host's raw qwen27b_models_dir where it passes the check (doctor and status read
    the link and the disk where the deploy put them); a bad value is the settings check's to name."""
    value = data.get(KEY)
    if not isinstance(value, str):
        return paths
    try:
        return with_models_dir(paths, check_models_dir(host, value, paths))
    except BadHostData:
        return paths
