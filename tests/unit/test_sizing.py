"""The embedded PostgreSQL's settings sized for a machine (ragservice/db/sizing.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragservice.db import sizing
from ragservice.db.sizing import Machine, peak_mb, recommend, to_mb
from ragservice.errors import ConfigurationError

GB = 1024


def machine(memory_gb: float, cpus: int = 2, **kwargs: object) -> Machine:
    defaults: dict[str, object] = {"shm_mb": int(memory_gb * GB) // 2, "disk_free_mb": 500 * GB}
    defaults.update(kwargs)
    return Machine(memory_mb=int(memory_gb * GB), cpus=cpus, **defaults)  # type: ignore[arg-type]


@pytest.mark.parametrize("memory_gb", [0.25, 0.5, 1, 2, 4, 24, 64, 256, 1024])
@pytest.mark.parametrize("cpus", [1, 2, 16, 96])
def test_memory_settings_stay_within_the_machines_memory(memory_gb: float, cpus: int) -> None:
    sized = recommend(machine(memory_gb, cpus))
    ram = int(memory_gb * GB)
    assert set(sized) == set(sizing.TUNABLES)
    assert peak_mb(sized) <= ram * 3 // 4  # the rest for the service and the OS
    assert to_mb(sized["shared_buffers"]) <= ram // 4
    assert to_mb(sized["effective_cache_size"]) < ram
    assert to_mb(sized["maintenance_work_mem"]) <= min(2 * GB, ram // 8)
    assert to_mb(sized["work_mem"]) >= 1 and to_mb(sized["maintenance_work_mem"]) >= 16
    workers = int(sized["max_parallel_workers"])
    assert 1 <= workers <= cpus
    assert int(sized["max_worker_processes"]) >= max(8, workers)
    assert int(sized["max_parallel_workers_per_gather"]) <= min(4, workers)
    assert int(sized["max_parallel_maintenance_workers"]) <= min(4, workers)
    assert to_mb(sized["min_wal_size"]) < to_mb(sized["max_wal_size"])


def test_a_tiny_machine_gets_small_values() -> None:
    sized = recommend(machine(1, cpus=1))
    assert sized["shared_buffers"] == "256MB"
    assert sized["maintenance_work_mem"] == "128MB"
    assert sized["work_mem"] == "8MB"  # no parallel workers per query on one CPU
    assert sized["max_parallel_workers_per_gather"] == "0"
    assert sized["max_parallel_maintenance_workers"] == "0"
    assert sized["max_worker_processes"] == "8"
    assert peak_mb(sized) <= 1024 * 3 // 4


def test_a_big_machine_is_capped_where_more_stops_helping() -> None:
    sized = recommend(machine(512, cpus=64))
    assert sized["shared_buffers"] == "16GB"
    assert sized["effective_cache_size"] == "384GB"
    assert sized["maintenance_work_mem"] == "2GB"
    assert sized["work_mem"] == "256MB"
    assert sized["max_wal_size"] == "8GB" and sized["min_wal_size"] == "1GB"
    assert sized["checkpoint_timeout"] == "15min"
    assert (sized["max_parallel_workers"], sized["max_worker_processes"]) == ("64", "68")
    assert sized["max_parallel_workers_per_gather"] == "4"


def test_the_machine_this_session_describes_in_the_issue() -> None:
    """24 GB, 2 cores: six times PostgreSQL's stock 128 MB... and then some."""
    sized = recommend(machine(24, cpus=2, shm_mb=24 * GB, disk_free_mb=60 * GB))
    assert sized["shared_buffers"] == "6GB"
    assert sized["max_wal_size"] == "8GB"
    assert sized["dynamic_shared_memory_type"] == "posix"


def test_a_small_dev_shm_moves_dynamic_shared_memory_to_files() -> None:
    """Docker's default /dev/shm is 64 MB: a parallel hash join or index build would fail with
    'No space left on device'."""
    assert recommend(machine(24, shm_mb=64))["dynamic_shared_memory_type"] == "mmap"
    assert recommend(machine(24, shm_mb=None))["dynamic_shared_memory_type"] == "mmap"


def test_a_mid_sized_dev_shm_bounds_what_parallel_work_puts_there() -> None:
    sized = recommend(machine(64, cpus=8, shm_mb=1024))
    assert sized["dynamic_shared_memory_type"] == "posix"
    assert to_mb(sized["maintenance_work_mem"]) <= 512  # half of /dev/shm
    # A parallel hash join (leader and 4 workers, each hash up to 2 x work_mem): a quarter.
    assert 2 * 5 * to_mb(sized["work_mem"]) <= 256


def test_wal_is_bounded_by_the_free_disk_and_compressed_as_the_server_can() -> None:
    assert recommend(machine(24, disk_free_mb=4 * GB))["max_wal_size"] == "1GB"
    assert recommend(machine(24, disk_free_mb=100))["max_wal_size"] == "256MB"
    assert recommend(machine(2, disk_free_mb=None))["max_wal_size"] == "4GB"
    assert recommend(machine(2))["wal_compression"] == "pglz"
    both = frozenset({"pglz", "lz4", "zstd"})
    assert recommend(machine(2, wal_compression=both))["wal_compression"] == "lz4"
    zstd = frozenset({"pglz", "zstd"})
    assert recommend(machine(2, wal_compression=zstd))["wal_compression"] == "zstd"


def test_the_cgroups_memory_limit_bounds_the_machine(tmp_path: Path) -> None:
    v2 = tmp_path / "memory.max"
    v2.write_text(f"{2 * 2**30}\n")
    assert sizing.cgroup_memory_limit_mb((v2,)) == 2 * GB
    v2.write_text("max\n")
    assert sizing.cgroup_memory_limit_mb((v2,)) is None
    v1 = tmp_path / "memory.limit_in_bytes"
    v1.write_text("9223372036854771712\n")  # v1's "unlimited"
    assert sizing.cgroup_memory_limit_mb((tmp_path / "absent", v1)) is None
    assert sizing.cgroup_memory_limit_mb((tmp_path / "absent",)) is None
    cpu = tmp_path / "cpu.max"
    cpu.write_text("150000 100000\n")
    assert sizing.cpu_count(cpu) == 1
    cpu.write_text("max 100000\n")
    assert sizing.cpu_count(cpu) >= 1


def test_probe_takes_the_lower_of_ram_and_the_cgroup_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = tmp_path / "memory.max"
    limit.write_text(f"{2**30}\n")
    monkeypatch.setattr(sizing, "CGROUP_MEMORY_LIMITS", (limit,))
    monkeypatch.setattr(sizing, "physical_memory_mb", lambda: 24 * GB)
    probed = sizing.probe_machine(tmp_path / "not-yet" / "pgdata")
    assert probed.memory_mb == GB and probed.memory_limited_by_cgroup
    assert probed.disk_free_mb is not None  # the nearest existing parent's filesystem
    assert "1.0 GiB memory (the cgroup's limit)" in probed.describe()
    assert recommend(probed)["shared_buffers"] == "256MB"


def test_overrides_win_and_are_checked() -> None:
    overrides = sizing.parse_overrides(" shared_buffers=2GB , max_wal_size = 16GB,")
    assert overrides == {"shared_buffers": "2GB", "max_wal_size": "16GB"}
    planned = {p.name: p for p in sizing.plan(machine(24), overrides)}
    assert (planned["shared_buffers"].value, planned["shared_buffers"].origin) == (
        "2GB",
        "override",
    )
    assert planned["work_mem"].origin == "sized"
    assert sizing.parse_overrides("") == {}
    for bad, says in [
        ("shared_buffer=2GB", "'shared_buffer' is not a setting ragservice sizes"),
        ("shared_buffers", "is not name=value"),
        ("shared_buffers=2", "is not of the form"),  # a bare number: 8 kB pages or kB?
        ("shared_buffers='2GB'\ninclude '/etc/passwd'", "is not of the form"),
        ("wal_compression=brotli", "is not of the form"),
        ("max_parallel_workers=-1", "is not of the form"),
    ]:
        with pytest.raises(ConfigurationError, match=says):
            sizing.parse_overrides(bad)
    with pytest.raises(ConfigurationError, match="built without it"):
        sizing.plan(machine(24), {"wal_compression": "lz4"})


def test_the_hnsw_build_memory_is_sized_in_the_same_place() -> None:
    assert sizing.index_build_memory_mb(24 * GB, 24 * GB) == 6 * GB
    assert sizing.index_build_memory_mb(256 * GB, None) == 16 * GB
    assert sizing.index_build_memory_mb(24 * GB, 1 * GB) == 512  # half of /dev/shm's free space
    assert sizing.index_build_memory_mb(100, 10) == 64
