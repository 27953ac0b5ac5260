"""The symbol versions a wheel's shared objects need from the host (GLIBC_2.34, GLIBCXX_3.4.30...).

A wheel built on a newer distribution than the host's fails at import with "version `GLIBC_2.38'
not found": in the middle of a deploy, after the driver and CUDA are in. Reading the ELF version
needs (.gnu.version_r) of every .so in the wheel first lets the gate refuse that host before it is
touched. A small stdlib reader rather than pyelftools: the controller venv has no pyelftools, and a
new dependency reinstalls every checkout's venv for ~60 lines of struct unpacking (ELF64 and ELF32,
either byte order; anything else is not read).
"""

from __future__ import annotations

import re
import struct
import zipfile
from pathlib import Path

SHT_GNU_VERNEED = 0x6FFFFFFE
_VERSION = re.compile(r"^(?P<family>[A-Z]+)_(?P<number>[0-9]+(?:\.[0-9]+)*)$")


class ElfError(ValueError):
    """Not an ELF file this reader understands, or a truncated one."""


def version_needs(data: bytes) -> dict[str, set[str]]:
    """{needed library: {version names}} from an ELF file's .gnu.version_r section ({} without one)."""
    if data[:4] != b"\x7fELF" or len(data) < 64:
        raise ElfError("not an ELF file")
    bits, order = data[4], {1: "<", 2: ">"}.get(data[5])
    if bits not in (1, 2) or order is None:
        raise ElfError("unknown ELF class or byte order")
    try:
        if bits == 2:
            shoff, = struct.unpack_from(order + "Q", data, 0x28)
            shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A)
            section = order + "IIQQQQIIQQ"  # name type flags addr offset size link info align entsize
        else:
            shoff, = struct.unpack_from(order + "I", data, 0x20)
            shentsize, shnum = struct.unpack_from(order + "HH", data, 0x2E)
            section = order + "IIIIIIIIII"
        sections = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
        needs: dict[str, set[str]] = {}
        for _, kind, _, _, offset, _, link, count, _, _ in sections:
            if kind != SHT_GNU_VERNEED:
                continue
            strings = sections[link][4]

            def name(at: int) -> str:
                end = data.index(b"\0", strings + at)
                return data[strings + at:end].decode("ascii", "replace")

            entry = offset
            for _ in range(count):  # sh_info: the number of Verneed entries
                _, aux_count, file_at, aux, following = struct.unpack_from(order + "HHIII", data, entry)
                wanted = needs.setdefault(name(file_at), set())
                at = entry + aux
                for _ in range(aux_count):
                    _, _, _, name_at, aux_next = struct.unpack_from(order + "IHHII", data, at)
                    wanted.add(name(name_at))
                    at += aux_next
                if not following:
                    break
                entry += following
        return needs
    except (struct.error, IndexError, ValueError) as error:
        raise ElfError(f"truncated or malformed ELF: {error}") from None


def _key(number: str) -> tuple[int, ...]:
    return tuple(int(part) for part in number.split("."))


def highest(versions, family: str) -> str | None:
    """The highest '2.34' of the 'GLIBC_2.34'-style names of one family ('GLIBC', 'GLIBCXX', 'CXXABI')."""
    numbers = [m["number"] for v in versions if (m := _VERSION.match(v)) and m["family"] == family]
    return max(numbers, key=_key) if numbers else None


def newer(a: str, b: str) -> bool:
    """Whether version a ('2.38') is newer than b ('2.35')."""
    return _key(a) > _key(b)


def wheel_needs(wheel: Path) -> dict:
    """{"GLIBC": highest or None, "GLIBCXX": ..., "CXXABI": ..., "by": {family: the member needing it}}
    over every shared object in the wheel (a zip file read on the controller)."""
    found: dict[str, tuple[str, str]] = {}
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            base = member.rsplit("/", 1)[-1]
            if not (base.endswith(".so") or ".so." in base):
                continue
            try:
                needs = version_needs(archive.read(member))
            except ElfError:
                continue  # a linker script or a non-ELF file named .so
            versions = set().union(*needs.values()) if needs else set()
            for family in ("GLIBC", "GLIBCXX", "CXXABI"):
                top = highest(versions, family)
                if top and (family not in found or newer(top, found[family][0])):
                    found[family] = (top, member)
    return {**{f: found[f][0] if f in found else None for f in ("GLIBC", "GLIBCXX", "CXXABI")},
            "by": {f: member for f, (_, member) in found.items()}}
