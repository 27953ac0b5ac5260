"""The install choices and the binary needs (issue 50 item 3, cut from gate.py): the plan's rows for
CUDA, Python, vLLM, torch, the model and the draft, each with why and whether it is kept; the host's
glibc/libstdc++ against what the engine's wheel needs; what qwen27b_require_hashes refuses; and what
the host will fetch (the plan's `fetch:` lines, `qwen27b reach`)."""

from __future__ import annotations

from dataclasses import replace

from qwen27b.plan import engine, filepins, sources
from qwen27b.plan.distname import normalize
from qwen27b.plan.driverplan import _TOOLKIT_PACKAGE
from qwen27b.plan.elfneeds import newer
from qwen27b.plan.gatetypes import Choice, Decision, DriverPlan, HostFacts, RefusedHost
from qwen27b.plan.settings import Settings
from qwen27b.plan.urlsecret import redact_url
from qwen27b.plan.planner import GiB
from qwen27b.plan.stack import ResolvedStack, revision_dir_name


GLIBC_FIX = ("reinstall the host with Ubuntu 22.04 (glibc 2.35) or 24.04 (2.39), or use a build of {wheel} made for "
             "glibc <= {have}")


GLIBCXX_FIX = ("install a newer libstdc++6 (Ubuntu 20.04's has GLIBCXX_3.4.28, 22.04's 3.4.30, 24.04's 3.4.33), "
               "reinstall the host with a newer Ubuntu, or use a build of {wheel} made for GLIBCXX <= {have}")


def binary_needs_check(host: str, glibc: str | None, rs: ResolvedStack, needs: dict | None = None,
                       libstdcxx: str | None = None) -> str | None:
    """The host's glibc and libstdc++ against what the vLLM wheel needs: `needs` read from the wheel's
    shared objects (elfneeds.wheel_needs) refuses a host below them; without the wheel, the build's
    glibc_floor in the stack file refuses when verified, else returns a warning. None: fine, or
    nothing to compare."""
    wheel = rs.profile["vllm"].get("filename") or f"{rs.profile['vllm']['dist']} {rs.profile['vllm']['version']}"
    if needs and needs.get("GLIBCXX") and libstdcxx and newer(needs["GLIBCXX"], libstdcxx):
        raise RefusedHost(host, f"{wheel} needs GLIBCXX_{needs['GLIBCXX']} (its {needs['by']['GLIBCXX']} asks for it), "
                          f"the host's libstdc++ has GLIBCXX_{libstdcxx}: it would fail at import, after the driver "
                          "and CUDA are in", GLIBCXX_FIX.format(wheel=wheel, have=libstdcxx))
    if not glibc:
        return None
    if needs and needs.get("GLIBC"):
        if newer(needs["GLIBC"], glibc):
            raise RefusedHost(host, f"{wheel} needs GLIBC_{needs['GLIBC']} (its {needs['by']['GLIBC']} asks for it), "
                              f"the host has glibc {glibc}: it would fail at import, after the driver and CUDA are in",
                              GLIBC_FIX.format(wheel=wheel, have=glibc))
        return None
    floor = rs.build.get("glibc_floor")
    if not floor or not newer(floor["version"], glibc):
        return None
    said = (f"{wheel} is known to run on glibc >= {floor['version']}, the host has {glibc}; its own needs were not "
            f"read (put the wheel in the controller wheelhouse) {rs.cite(floor.get('source'))}")
    if floor.get("verified", True):
        raise RefusedHost(host, said, GLIBC_FIX.format(wheel=wheel, have=glibc))
    return said + " (verified: false): the import may fail mid-deploy; fix: " + GLIBC_FIX.format(wheel=wheel, have=glibc)


def unpinned(rs: ResolvedStack, os_row: dict, settings: Settings, by_default: bool = False) -> list[tuple[str, str]]:
    """(cause, fix) for each artifact the deploy would fetch without a sha256 to check it against:
    what qwen27b_require_hashes refuses (without it, _warnings says the same as warnings). `by_default`
    (the profile's default, not the host's true): only the engine wheel the stack pins."""
    out, vllm = [], rs.profile["vllm"]
    if vllm.get("url") and not vllm.get("sha256"):
        out.append((f"qwen27b_require_hashes{' (the profile default)' if by_default else ''}: {vllm['filename']} "
                    "has no sha256 in the stack file",
                    "pin it with qwen27b_stack_overrides {'vllm': {'sha256': '<sha256 of the wheel>'}}"
                    + (", or set qwen27b_require_hashes false" if by_default else "")))
    if by_default:
        return out
    cuda = rs.profile.get("cuda") or {}
    if cuda.get("needed_by_vllm") and not os_row.get("cuda_keyring_sha256"):
        out.append((f"qwen27b_require_hashes: {cuda['keyring_deb']} for {os_row['cuda_repo']} has no sha256 in the "
                    "stack file", "pin it (stack key os_support[].cuda_keyring_sha256)"))
    if settings.dflash_cli:
        out.append(("qwen27b_require_hashes: qwen27b_dflash_cli installs PyPI's dflash by name, without a hash",
                    "set qwen27b_dflash_cli to false"))
    if not settings.wheelhouse_dir:
        # only a pushed wheelhouse installs with uv --require-hashes (roles/vllm.py): from a mirror or
        # the indexes, the engine's dependencies (torch among them) come by name
        torch = rs.profile.get("torch") or {}
        source = (f"the lab mirror {redact_url(settings.wheel_mirror)}" if settings.wheel_mirror else
                  "the package indexes" + (f" (torch from {redact_url(sources.torch_index(rs.profile, settings))})"
                                           if torch.get("index_url") else ""))
        out.append((f"qwen27b_require_hashes: without qwen27b_wheelhouse_dir, {vllm['dist']}=={vllm['version']} and "
                    f"its dependencies install by name from {source}, without hashes",
                    "build a wheelhouse on the controller (`python3 -m qwen27b.tools.cpu_smoke wheelhouse`: each wheel "
                    "with its sha256, checked on the host by uv --require-hashes) and set qwen27b_wheelhouse_dir to it"))
    return out


def _choices(facts: HostFacts, rs: ResolvedStack, settings: Settings, driver: DriverPlan | None,
             spec: "engine.SpecChoice | None" = None) -> list[Choice]:
    p, out = rs.profile, []
    if driver is not None:
        out.append(Choice("driver", driver.kept or driver.package, driver.reason, driver.action))
    cuda = p.get("cuda")
    if cuda:
        if cuda.get("needed_by_vllm"):
            action = "keep" if cuda["package"] in facts.packages else "install"
            out.append(Choice("cuda", cuda["package"], f"{cuda['why']} {rs.cite(cuda['source'])}" if cuda.get("why")
                              else rs.cite(cuda["source"]), action))
        else:
            found = sorted(f"{name} {ver}" for name, ver in facts.packages.items() if _TOOLKIT_PACKAGE.match(name))
            left = (f"; the installed {', '.join(found)} is left alone: nothing here compiles against it"
                    + (f" (and CUDA {cuda['max_major'] + 1}+ cannot build for this GPU)" if any(
                        int(_TOOLKIT_PACKAGE.match(f.split()[0])[1]) > cuda["max_major"] for f in found) else "")
                    if found else "")
            out.append(Choice("cuda", f"{cuda['package']} (not installed)",
                              f"the {p['vllm']['build']} vLLM build ships its CUDA {cuda['toolkit']} runtime in its wheels and "
                              f"needs no compiler; a toolkit, if added, must stay <= {cuda['max_major']}.x{left} "
                              f"{rs.cite(cuda['source'])}", "skip"))
    out.append(python_row(facts, rs, settings)[0])
    hashes = filepins.hash_choice(settings.require_hashes, p, rs.cite)
    if hashes:
        out.append(Choice("hashes", *hashes, "keep"))
    vllm = p["vllm"]
    out.append(Choice("vllm", f"{vllm['dist']}=={vllm['version']}",
                      f"build '{vllm['build']}' into release {rs.stack_hash} {rs.cite(vllm['source'])}", "install"))
    torch = p["torch"]
    if torch.get("index_url") or torch.get("requirement"):
        index = sources.torch_index(p, settings)
        out.append(Choice("torch", torch.get("requirement") or "from index", f"{redact_url(index) if index else 'wheelhouse'}"
                          + (f", must list {torch['required_arch']}" if torch.get("required_arch") else "")
                          + f" {rs.cite(torch['source'])}", "install"))
    model_why = (f"format {rs.model['format']}" + (f" {rs.cite(rs.model['cite'])}" if rs.model.get("cite") else "")
                 + filepins.choice_note(rs.model, rs.cite))
    out.append(Choice("model", f"{rs.model['id']}@{rs.model['revision']}", *_on_disk(facts, rs.model, model_why)))
    if spec is not None and spec.method == "dflash2" and rs.draft:
        out.append(Choice("draft", f"{rs.draft['id']}@{rs.draft['revision']}", *_on_disk(
            facts, rs.draft, f"{rs.draft['speculative']['method']}, {spec.depth} "
                             f"speculative tokens, kept {rs.draft['format']} {rs.cite('dflash-dense-head')}"
                             + filepins.choice_note(rs.draft, rs.cite))))
    return out


def python_row(facts: HostFacts, rs: ResolvedStack, settings: Settings, cached: tuple[str, ...] = (),
               failed: tuple[str, ...] = (), downloaded: tuple[str, ...] = ()) -> tuple[Choice, str | None]:
    """The plan's python row and its warning: where uv's build comes from (sources.python_source,
    which the toolchain role asks too, with the same controller cache), said as it will happen."""
    py = rs.profile["python"]
    have = facts.pythons.get(py["version"])
    if have:
        return Choice("python", py["version"], f"present at {have}", "keep"), None
    if py.get("route") == "system":
        return Choice("python", py["version"], "the OS's own python3 (CPU smoke profile)", "install"), None
    source = sources.python_source(settings, rs.fetch_sources, py["version"], cached, downloaded)
    return (Choice("python", py["version"], f"the OS ships {', '.join(sorted(facts.pythons)) or 'none'}; uv's "
                   f"managed Python {source.shown} {rs.cite(py['source'])}", "install"),
            sources.python_warning(settings, source, py["version"], sources.github_failed(failed, rs.fetch_sources)))


def with_cached_python(decision: Decision, cached: tuple[str, ...], failed: tuple[str, ...] = (),
                       downloaded: tuple[str, ...] = ()) -> Decision:
    """The python row (and warning) once the controller's side is read (like mark_installed's venv):
    'from the controller cache' only when it holds the build (`downloaded`: those the controller
    fetched itself); `failed`: the URLs the host's last `qwen27b reach` could not reach (GitHub
    among them: warned)."""
    args = (decision.facts, decision.stack, decision.settings)
    (before, warned), (row, warning) = python_row(*args), python_row(*args, cached, failed, downloaded)
    if (row, warning) == (before, warned):
        return decision
    return replace(decision, choices=[row if c.what == "python" else c for c in decision.choices],
                   warnings=[w for w in decision.warnings if w != warned] + ([warning] if warning else []))


def host_fetches(decision: Decision, cached: tuple[str, ...] = ()) -> list[sources.Fetch]:
    """Every network source this host's deploy will fetch from (the plan's `fetch:` lines, what
    `qwen27b reach` checks): Python only where uv installs it, the CUDA repository only where a
    toolkit is installed, the wheels only where the release venv lacks the build, a checkpoint
    only where it is not verified on disk (the draft only where it serves)."""
    rs, facts = decision.stack, decision.facts
    py, cuda = rs.profile["python"], rs.profile.get("cuda") or {}
    kept = {c.what for c in decision.choices if c.action == "keep"}
    python = None if facts.pythons.get(py["version"]) or py.get("route") == "system" else \
        sources.python_source(decision.settings, rs.fetch_sources, py["version"], cached)
    repo = (decision.os_row.get("cuda_repo") if cuda.get("needed_by_vllm") and cuda["package"] not in facts.packages
            else None)
    models = [e for what, e in (("model", rs.model), ("draft", rs.draft if decision.draft_path else None))
              if e and what not in kept]
    return sources.fetches(rs.fetch_sources, rs.profile, decision.settings, python, models, repo, wheels="vllm" not in kept)


def _on_disk(facts: HostFacts, entry: dict, why: str) -> tuple[str, str]:
    """(reason, action) for a model revision: 'keep' when ModelsOnDisk found it verified, so an
    up-to-date host's plan says what the weights role will do (nothing), not 'install'."""
    on_disk = facts.models_on_disk.get(revision_dir_name(entry))
    if on_disk and on_disk["verified"]:
        return f"{why}; verified on disk ({on_disk['bytes'] / GiB:.1f} GiB)", "keep"
    return why, "install"


def mark_installed(decision: Decision, venv_packages: dict) -> Decision:
    """The plan's vllm and torch rows once the release venv's wheels are read (VenvPackages of
    release_venv, known only after decide: the release is named by the stack hash). 'keep' when
    the venv already holds the planned vLLM build and the model source's download client, as the
    vllm role will find it; torch comes with
    that install (the release is keyed by the stack's torch pin), so it is kept with it."""
    vllm = decision.stack.profile["vllm"]
    have = {normalize(k): v for k, v in venv_packages.items()}
    if have.get(normalize(vllm["dist"])) != vllm["version"]:
        return decision
    for client in sources.fetch_clients(decision.stack, decision.settings):
        name, _, version = client.partition("==")
        if have.get(normalize(name)) != version:
            return decision  # the vllm role installs the model source's client: wheels are fetched
    rs, where = decision.stack, f"already in release {decision.stack.stack_hash}"
    torch = rs.profile.get("torch") or {}
    kept = {"vllm": f"build '{vllm['build']}' {where} {rs.cite(vllm['source'])}",
            "torch": (f"torch {have['torch']}" if "torch" in have else "installed with the vLLM build")
            + f" {where}" + (f" {rs.cite(torch['source'])}" if torch.get("source") else "")}
    choices = [replace(c, action="keep", reason=kept[c.what]) if c.what in kept and c.action == "install"
               else c for c in decision.choices]
    return replace(decision, choices=choices)
