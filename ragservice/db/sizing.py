"""PostgreSQL's settings sized for the machine it runs on.

`recommend(machine)` is pure: from the memory (the cgroup's limit when it is lower than the
RAM), the CPUs, the size of /dev/shm and the free disk of the data directory it gives the value
of each setting in `TUNABLES`. `plan(machine, overrides)` adds the operator's overrides
(`RAGSERVICE_EMBEDDED_PG_SETTINGS`, checked by `parse_overrides`). The embedded server writes
the plan into its data directory before every start (`db.embedded`); `ragservice db settings`
shows it beside the running values.

Memory, with R the machine's memory:
- `shared_buffers` R/4 (at most 16 GB). PostgreSQL 18 on Linux keeps it in anonymous shared
  memory (`shared_memory_type = mmap`), not in /dev/shm.
- `effective_cache_size` 3R/4: the planner's guess of what the OS caches (nothing allocated).
- `maintenance_work_mem` R/8 (at most 2 GB); `autovacuum_work_mem` R/32 (at most 512 MB) for
  each of the 3 autovacuum workers.
- `work_mem` R/4 shared by `BUSY_QUERIES` queries at once, each with its parallel workers,
  each sort or hash up to `hash_mem_multiplier` (2) times work_mem (at most 256 MB).
So PostgreSQL busy takes at most `peak_mb` ≈ 0.72 R, and the rest stays for the service
and the operating system. Dynamic shared memory (parallel hash joins, parallel index builds:
pgvector puts the HNSW graph there) lives in /dev/shm (`dynamic_shared_memory_type = posix`):
when /dev/shm is smaller than `SMALL_SHM_MB` (Docker's default is 64 MB) it moves to files in
the data directory (`mmap`), else `maintenance_work_mem` stays within half of /dev/shm and a
parallel hash join within a quarter.

WAL: `max_wal_size` 8 GB (4 GB under 8 GB of memory), at most a quarter of the data
directory's free disk; `min_wal_size` an eighth of that (at most 1 GB); `checkpoint_timeout`
15 min; `wal_compression` lz4, else zstd, else pglz (whichever the server was built with).

Workers from the CPU count C: `max_parallel_workers` C, `max_worker_processes` C + 4 (at
least 8), `max_parallel_workers_per_gather` and `max_parallel_maintenance_workers` C/2 (at
most 4, and at most one per GB of memory).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ragservice.errors import ConfigurationError

MB_PER_GB = 1024
BUSY_QUERIES = 16
"""Queries planned to sort or hash at once (the API's pools, a worker, an ingest)."""
HASH_MEM_MULTIPLIER = 2
"""PostgreSQL's default: a hash may take this many times work_mem."""
AUTOVACUUM_WORKERS = 3
"""PostgreSQL's default `autovacuum_max_workers`."""
SMALL_SHM_MB = 256
"""Below this, dynamic shared memory goes to files in the data directory, not /dev/shm."""
INDEX_BUILD_MAX_MB = 16 * MB_PER_GB
INDEX_BUILD_MIN_MB = 64

_MEMORY = r"\d+(kB|MB|GB|TB)"
_TIME = r"\d+(ms|s|min|h|d)?"
_COUNT = r"\d+"

TUNABLES: dict[str, str] = {
    "shared_buffers": _MEMORY,
    "effective_cache_size": _MEMORY,
    "maintenance_work_mem": _MEMORY,
    "autovacuum_work_mem": _MEMORY,
    "work_mem": _MEMORY,
    "dynamic_shared_memory_type": "posix|sysv|mmap",
    "max_wal_size": _MEMORY,
    "min_wal_size": _MEMORY,
    "checkpoint_timeout": _TIME,
    "wal_compression": "off|on|pglz|lz4|zstd",
    "max_worker_processes": _COUNT,
    "max_parallel_workers": _COUNT,
    "max_parallel_workers_per_gather": _COUNT,
    "max_parallel_maintenance_workers": _COUNT,
}
"""The settings sized here (and the only ones an override may name), each with the form of
its value: a regular expression."""

RESTART_NEEDED = frozenset({"shared_buffers", "max_worker_processes", "dynamic_shared_memory_type"})
"""Settings that PostgreSQL reads only when it starts."""


@dataclass(frozen=True, slots=True)
class Machine:
    """What the sizing looks at."""

    memory_mb: int
    """The RAM, or the cgroup's memory limit when that is lower."""
    cpus: int
    shm_mb: int | None
    """The size of /dev/shm (None: there is none)."""
    disk_free_mb: int | None
    """Free space where the data directory is (None: unknown)."""
    wal_compression: frozenset[str] = frozenset({"pglz"})
    """The WAL compression methods the server supports."""
    memory_limited_by_cgroup: bool = False

    def describe(self) -> str:
        """One line: the figures the recommendation was sized from."""
        memory = f"{_human(self.memory_mb)} memory"
        if self.memory_limited_by_cgroup:
            memory += " (the cgroup's limit)"
        shm = "no /dev/shm" if self.shm_mb is None else f"/dev/shm {_human(self.shm_mb)}"
        disk = "" if self.disk_free_mb is None else f", {_human(self.disk_free_mb)} free disk"
        return f"{memory}, {self.cpus} CPUs, {shm}{disk}"


@dataclass(frozen=True, slots=True)
class Planned:
    """One setting's value for the server, and where it came from: `sized` or `override`."""

    name: str
    value: str
    origin: str


def recommend(machine: Machine) -> dict[str, str]:
    """Each setting of `TUNABLES` for `machine` (see the module's doc), in that order."""
    ram, cpus = max(machine.memory_mb, 64), max(machine.cpus, 1)
    shared_buffers = _clamp(ram // 4, 16, 16 * MB_PER_GB)
    per_gather = min(4, cpus // 2, ram // MB_PER_GB)  # none under 1 GB: not worth the memory
    maintenance = _clamp(ram // 8, 16, 2 * MB_PER_GB)
    operations = BUSY_QUERIES * (1 + per_gather) * HASH_MEM_MULTIPLIER
    work_mem = _clamp(ram // 4 // operations, 1, 256)
    dsm_type = "posix"
    if machine.shm_mb is None or machine.shm_mb < SMALL_SHM_MB:
        dsm_type = "mmap"
    else:
        maintenance = max(16, min(maintenance, machine.shm_mb // 2))
        hash_join = HASH_MEM_MULTIPLIER * (1 + per_gather)
        work_mem = max(1, min(work_mem, machine.shm_mb // 4 // hash_join))
    max_wal = (8 if ram >= 8 * MB_PER_GB else 4) * MB_PER_GB
    if machine.disk_free_mb is not None:
        max_wal = _clamp(machine.disk_free_mb // 4, 256, max_wal)
    return {
        "shared_buffers": _mb(shared_buffers),
        "effective_cache_size": _mb(ram * 3 // 4),
        "maintenance_work_mem": _mb(maintenance),
        "autovacuum_work_mem": _mb(_clamp(ram // 32, 8, 512)),
        "work_mem": _mb(work_mem),
        "dynamic_shared_memory_type": dsm_type,
        "max_wal_size": _mb(max_wal),
        "min_wal_size": _mb(_clamp(max_wal // 8, 80, MB_PER_GB)),
        "checkpoint_timeout": "15min",
        "wal_compression": _wal_compression(machine.wal_compression),
        "max_worker_processes": str(max(8, cpus + 4)),
        "max_parallel_workers": str(cpus),
        "max_parallel_workers_per_gather": str(per_gather),
        "max_parallel_maintenance_workers": str(per_gather),
    }


def plan(machine: Machine, overrides: Mapping[str, str]) -> list[Planned]:
    """The settings for the server: `recommend(machine)` with `overrides` (checked) on top."""
    check_overrides(overrides, machine)
    sized = recommend(machine)
    return [
        Planned(name, overrides[name], "override")
        if name in overrides
        else Planned(name, value, "sized")
        for name, value in sized.items()
    ]


def peak_mb(values: Mapping[str, str]) -> int:
    """The memory PostgreSQL takes busy with these settings (see the module's doc): shared
    buffers, one maintenance job, the autovacuum workers and `BUSY_QUERIES` queries with their
    parallel workers."""
    per_gather = int(values["max_parallel_workers_per_gather"])
    queries = BUSY_QUERIES * (1 + per_gather) * HASH_MEM_MULTIPLIER * to_mb(values["work_mem"])
    return (
        to_mb(values["shared_buffers"])
        + to_mb(values["maintenance_work_mem"])
        + AUTOVACUUM_WORKERS * to_mb(values["autovacuum_work_mem"])
        + queries
    )


def index_build_memory_mb(available_mb: int, shm_free_mb: int | None) -> int:
    """maintenance_work_mem of one HNSW index build (`embedding.indexing`): a quarter of the
    available memory, at most 16 GB and at most half the free space of /dev/shm, where
    parallel workers share the graph; at least 64 MB."""
    limit = INDEX_BUILD_MAX_MB if shm_free_mb is None else min(INDEX_BUILD_MAX_MB, shm_free_mb // 2)
    return max(INDEX_BUILD_MIN_MB, min(available_mb // 4, limit))


# -- overrides --------------------------------------------------------------------------------


def parse_overrides(text: str) -> dict[str, str]:
    """`name=value,name=value` (`RAGSERVICE_EMBEDDED_PG_SETTINGS`) as a mapping, each name one
    of `TUNABLES` and each value of its form; ConfigurationError says what is wrong."""
    overrides: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not name or not value:
            raise ConfigurationError(f"RAGSERVICE_EMBEDDED_PG_SETTINGS: {item!r} is not name=value")
        overrides[name] = value
    check_overrides(overrides)
    return overrides


def check_overrides(overrides: Mapping[str, str], machine: Machine | None = None) -> None:
    """ConfigurationError for a name outside `TUNABLES`, a value not of its setting's form, or
    a WAL compression the server (of `machine`) was not built with."""
    for name, value in overrides.items():
        form = TUNABLES.get(name)
        if form is None:
            raise ConfigurationError(
                f"RAGSERVICE_EMBEDDED_PG_SETTINGS: {name!r} is not a setting ragservice sizes; "
                f"known: {', '.join(TUNABLES)}"
            )
        if re.fullmatch(form, value) is None:
            raise ConfigurationError(
                f"RAGSERVICE_EMBEDDED_PG_SETTINGS: {name}={value!r} is not of the form {form}"
            )
    compression = overrides.get("wal_compression")
    built = machine.wal_compression if machine is not None else None
    if built is not None and compression in {"lz4", "zstd"} and compression not in built:
        raise ConfigurationError(
            f"RAGSERVICE_EMBEDDED_PG_SETTINGS: wal_compression={compression}: this PostgreSQL "
            f"was built without it (it has: {', '.join(sorted(built))})"
        )


# -- units ------------------------------------------------------------------------------------

_UNIT_MB = {"kB": 1 / 1024, "MB": 1, "GB": MB_PER_GB, "TB": MB_PER_GB * MB_PER_GB}


def to_mb(value: str) -> int:
    """A memory setting's value (`6GB`, `512MB`, `8192kB`) in MB, rounded down."""
    match = re.fullmatch(r"(\d+)\s*(kB|MB|GB|TB)", value.strip())
    if match is None:
        raise ValueError(f"not a memory size with its unit: {value!r}")
    return int(int(match.group(1)) * _UNIT_MB[match.group(2)])


def _mb(value: int) -> str:
    """`value` MB as PostgreSQL writes it: in GB when whole."""
    if value >= MB_PER_GB and value % MB_PER_GB == 0:
        return f"{value // MB_PER_GB}GB"
    return f"{value}MB"


def _human(mb: int) -> str:
    return f"{mb / MB_PER_GB:.1f} GiB" if mb >= MB_PER_GB else f"{mb} MiB"


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))


def _wal_compression(methods: frozenset[str]) -> str:
    return next((m for m in ("lz4", "zstd") if m in methods), "pglz")


# -- the machine ------------------------------------------------------------------------------

CGROUP_MEMORY_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def probe_machine(data_dir: Path | None = None, bin_dir: Path | None = None) -> Machine:
    """This machine's figures: memory (and its cgroup limit), CPUs, /dev/shm, the free disk
    of `data_dir` (or its nearest existing parent) and the WAL compressions of the server in
    `bin_dir` (its `pg_config`; pglz alone when None)."""
    physical = physical_memory_mb()
    limit = cgroup_memory_limit_mb()
    return Machine(
        memory_mb=min(physical, limit) if limit else physical,
        cpus=cpu_count(),
        shm_mb=filesystem_mb(Path("/dev/shm")),
        disk_free_mb=None if data_dir is None else filesystem_mb(data_dir, free=True, nearest=True),
        wal_compression=wal_compressions(bin_dir) if bin_dir is not None else frozenset({"pglz"}),
        memory_limited_by_cgroup=limit is not None and limit < physical,
    )


def physical_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20


def available_memory_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Memory available now (MemAvailable), within the cgroup's limit when one is set."""
    available = physical_memory_mb()
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) // 1024
                break
    except OSError:
        pass
    limit = cgroup_memory_limit_mb()
    return min(available, limit) if limit else available


def cgroup_memory_limit_mb(paths: tuple[Path, ...] | None = None) -> int | None:
    """The cgroup's memory limit in MB, or None when there is none (`max`, or v1's huge
    number) or no cgroup file. `paths`: where to look (`CGROUP_MEMORY_LIMITS`)."""
    for path in CGROUP_MEMORY_LIMITS if paths is None else paths:
        try:
            raw = path.read_text().strip()
        except OSError:
            continue
        if raw == "max" or not raw.isdigit():
            return None
        limit = int(raw) // 2**20
        return limit if limit < 2**40 else None  # v1 says "unlimited" with ~2**63 bytes
    return None


def cpu_count(cpu_max: Path | None = None) -> int:
    """The CPUs this process may use: its affinity, within the cgroup's CPU quota (read from
    `cpu_max`, else `CGROUP_CPU_MAX`)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        quota, period = (cpu_max or CGROUP_CPU_MAX).read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(cpus, 1)


def filesystem_mb(path: Path, *, free: bool = False, nearest: bool = False) -> int | None:
    """The size (or the free space) of the filesystem holding `path` (or, with `nearest`, its
    nearest existing parent) in MB; None when there is none."""
    for candidate in (path, *path.parents) if nearest else (path,):
        try:
            stats = os.statvfs(candidate)
        except OSError:
            continue
        blocks = stats.f_bavail if free else stats.f_blocks
        return blocks * stats.f_frsize // 2**20
    return None


@lru_cache(maxsize=4)
def wal_compressions(bin_dir: Path) -> frozenset[str]:
    """The WAL compression methods of the PostgreSQL in `bin_dir`, from `pg_config --configure`
    (`--with-lz4`, `--with-zstd`); pglz is always built in."""
    methods = {"pglz"}
    try:
        configure = subprocess.run(
            [str(bin_dir / "pg_config"), "--configure"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset(methods)
    methods.update(m for m in ("lz4", "zstd") if f"--with-{m}" in configure)
    return frozenset(methods)
