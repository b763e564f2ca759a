"""fastring-bench run for real (fastring-run -np 2, a plain np 1 run, np 3), its argument
errors, the BENCHMARKS.md generator on its JSON, and the asv suite's functions called directly."""
from __future__ import annotations

import importlib
import inspect
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fastring
from fastring.tools import bench

ROOT = Path(__file__).resolve().parents[1]
BIN = os.path.dirname(sys.executable)
RUN, BENCH = os.path.join(BIN, "fastring-run"), os.path.join(BIN, "fastring-bench")
SMALL = ["--min-bytes", "4K", "--max-bytes", "64K", "--iters", "5", "--warmup", "1"]
SIZES = [4096 << i for i in range(5)]


def run(cmd: list[str], expect_rc: int = 0, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == expect_rc, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def parse_table(stdout: str) -> dict[str, list[list[str]]]:
    """{op: data rows split into fields} from fastring-bench's output."""
    tables: dict[str, list[list[str]]] = {}
    op = None
    for line in stdout.splitlines():
        if line.startswith("# ") and line[2:].split(":")[0] in bench.OPS:
            op = line[2:].split(":")[0]
            tables[op] = []
        elif line.strip() and not line.startswith("#"):
            tables[op].append(line.split())
    return tables


def check_rows(fields: list[str], op: str, nranks: int, with_mpi: bool) -> None:
    """One table row: wrong counts are 0 and busbw/ratio agree with time and algbw."""
    size, count, dtype = int(fields[0]), int(fields[1]), fields[2]
    assert size == count * bench.numpy_dtype(dtype).itemsize
    libs = [fields[3:7]] + ([fields[7:11]] if with_mpi else [])
    for time_us, algbw, busbw, wrong in libs:
        assert wrong == "0"
        assert float(algbw) == pytest.approx(size / float(time_us) / 1e3, rel=0.02, abs=0.011)
        assert float(busbw) == pytest.approx(float(algbw) * bench.bus_factor(op, nranks), abs=0.011)
    if with_mpi:
        assert len(fields) == 12
        assert float(fields[11]) == pytest.approx(float(fields[7]) / float(fields[3]), rel=0.05, abs=0.011)


@pytest.fixture(scope="module")
def np2(tmp_path_factory):
    """One 2-rank sweep of every collective with --check --vs-mpi and its JSON."""
    out = tmp_path_factory.mktemp("bench") / "np2.json"
    proc = run([RUN, "-np", "2", "fastring-bench", "--op", "all", *SMALL, "--check", "--vs-mpi",
                "--json", str(out)])
    return proc, json.loads(out.read_text()), out


def test_np2_table(np2):
    proc, _, _ = np2
    tables = parse_table(proc.stdout)
    assert list(tables) == bench.available_ops()
    for op, rows in tables.items():
        assert [int(r[0]) for r in rows] == SIZES
        for fields in rows:
            check_rows(fields, op, 2, with_mpi=True)
    assert "Wrong results        : 0 (every result checked)" in proc.stdout
    assert "MPICH" in proc.stdout.splitlines()[0]
    # progress on rank 0 only, one line per size off a terminal
    for op in tables:
        assert proc.stderr.count(f"fastring-bench: {op} [5/5] 64 KiB") == 1


def test_np2_json(np2):
    _, doc, out = np2
    assert doc["np"] == 2 and doc["command"].startswith("fastring-bench --op all")
    assert doc["versions"]["fastring"] == fastring.__version__
    assert doc["versions"]["mpi_library"].startswith("MPICH")
    assert doc["host"]["cpu_count"] >= 1 and doc["ceiling"]["copy_gbs"] > 0
    ops = bench.available_ops()
    assert [(r["op"], r["bytes"]) for r in doc["rows"]] == [(op, s) for op in ops for s in SIZES]
    for r in doc["rows"]:
        assert r["fastring"]["wrong"] == 0 and r["mpi"]["wrong"] == 0
        assert r["iters"] == 5 and r["ratio"] == pytest.approx(r["mpi"]["time_us"] / r["fastring"]["time_us"])
        assert r["fastring"]["busbw"] == pytest.approx(r["fastring"]["algbw"] * bench.bus_factor(r["op"], 2))


def test_np1_without_launcher():
    proc = run([BENCH, "--op", "all", "--min-bytes", "4K", "--max-bytes", "8K", "--check", "--vs-mpi",
                "--no-progress"])
    for op, rows in parse_table(proc.stdout).items():
        assert len(rows) == 2
        for fields in rows:
            check_rows(fields, op, 1, with_mpi=True)
            assert (float(fields[5]) == 0.0) == (op != "broadcast")  # n-1 = 0 moves no bus bytes
    assert proc.stderr == ""


def test_np3_counts_split_among_ranks():
    """An odd rank count: partitioned ops round the count down to a multiple of 3."""
    proc = run([RUN, "-np", "3", "fastring-bench", "--op", "all", "--min-bytes", "4K", "--max-bytes", "8K",
                "--iters", "2", "--check", "--vs-mpi", "--root", "2", "--no-progress"])
    tables = parse_table(proc.stdout)
    assert "root 2" in proc.stdout
    for op, rows in tables.items():
        assert [int(r[1]) for r in rows] == ([1023, 2046] if op in bench.PARTITIONED else [1024, 2048])
        for fields in rows:
            check_rows(fields, op, 3, with_mpi=True)


@pytest.mark.parametrize("extra", [["--compression", "fp16", "--in-place"], ["--compression", "bf16"]])
def test_compression_and_in_place(extra):
    proc = run([RUN, "-np", "2", "fastring-bench", *SMALL, "--max-bytes", "16K", "--check", "--vs-mpi",
                "--no-progress", *extra])
    assert f"compression {extra[1]}" in proc.stdout
    for fields in parse_table(proc.stdout)["allreduce"]:
        check_rows(fields, "allreduce", 2, with_mpi=True)


def test_every_dtype(mpirun):
    proc = mpirun(2, "bench_dtypes")
    assert "OK bench_dtypes" in proc.stdout
    assert proc.stdout.count("Wrong results        : 0 (every result checked)") == \
        len(bench.DTYPES) * len(bench.available_ops())


def test_check_catches_a_wrong_result(mpirun):
    """A corrupted element on one rank in every call is counted once per call (3 + 1 warmup)."""
    proc = mpirun(2, "bench_sabotage", "--min-bytes", "4K", "--max-bytes", "8K", "--iters", "3",
                  "--warmup", "1", "--check", "--vs-mpi", "--no-progress", expect_rc=1)
    rows = parse_table(proc.stdout)["allreduce"]
    assert [(r[6], r[10]) for r in rows] == [("4", "0"), ("4", "0")]
    assert "Wrong results        : 8 (every result checked)" in proc.stdout


# ---------------------------------------------------------------------------- arguments

def test_size_helpers():
    assert [bench.parse_bytes(s) for s in ("1", "4K", "4k", "4KiB", "4KB", "256M", "2G")] == \
        [1, 4096, 4096, 4096, 4096, 256 << 20, 2 << 30]
    for bad in ("", "4X", "-4K", "1.5M", "0", "K"):
        with pytest.raises(ValueError, match="invalid size"):
            bench.parse_bytes(bad)
    assert bench.message_sizes(4096, 4096) == [4096]
    assert bench.message_sizes(1 << 12, 1 << 28) == [1 << k for k in range(12, 29)]
    assert bench.element_count("alltoall", 4096, 4, 3) == 1023
    assert bench.element_count("reducescatter", 4, 4, 3) == 3  # at least one element per rank
    assert [bench.bus_factor(op, 4) for op in bench.OPS] == [1.5, 0.75, 1.0, 0.75, 0.75]
    assert bench.default_iters(4096) == bench.MAX_ITERS and bench.default_iters(1 << 30) == bench.MIN_ITERS


@pytest.mark.parametrize("argv, message", [
    (["--min-bytes", "4X"], "invalid size '4X'"),
    (["--min-bytes", "8K", "--max-bytes", "4K"], "larger than --max-bytes"),
    (["--min-bytes", "2", "--dtype", "float32"], "smaller than one float32 element"),
    (["--op", "allsum"], "unknown collective 'allsum'"),
    (["--op", ","], "no collective given"),
    (["--dtype", "bool"], "invalid choice: 'bool'"),
    (["--compression", "fp32"], "invalid choice: 'fp32'"),
    (["--compression", "fp16", "--op", "broadcast"], "applies to allreduce only, not broadcast"),
    (["--in-place", "--op", "allgather"], "--in-place applies to --op allreduce only"),
    (["--vs-mpi", "--dtype", "bfloat16"], "MPI has no bfloat16 type to reduce in allreduce"),
    (["--iters", "0"], "--iters must be at least 1"),
    (["--warmup", "-1"], "--warmup must be at least 0"),
    (["--factor", "1"], "--factor must be at least 2"),
])
def test_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_root_must_be_a_rank(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--op", "broadcast", "--root", "5"])  # this process is a world of size 1
    assert "--root 5 is not a rank of this 1-rank job" in capsys.readouterr().err


def test_missing_collective_and_compression(monkeypatch, capsys):
    monkeypatch.delattr(fastring, "alltoall", raising=False)
    monkeypatch.delattr(fastring, "Compression", raising=False)
    assert "alltoall" not in bench.parse_args(["--op", "all"]).ops
    for argv, message in ((["--op", "alltoall"], "fastring.alltoall is not available"),
                          (["--compression", "fp16"], "has no fastring.Compression")):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert message in capsys.readouterr().err


def test_usage_error_on_every_rank_exits_2():
    proc = run([RUN, "-np", "2", "fastring-bench", "--max-bytes", "lots"], expect_rc=2, timeout=120)
    assert proc.stderr.count("invalid size 'lots'") == 2


# ---------------------------------------------------------------------------- BENCHMARKS.md

SCRIPT = str(ROOT / "scripts" / "benchmarks_md.py")


def test_benchmarks_md(np2, tmp_path):
    _, doc, out = np2
    md = tmp_path / "docs" / "BENCHMARKS.md"
    proc = run([sys.executable, SCRIPT, str(out), "-o", str(md)])
    text = md.read_text()
    assert f"`fastring-run -np 2 {doc['command']}`" in text
    for op in bench.available_ops():
        assert f"## {op}, float32, 2 ranks" in text
    assert text.count("| 64 KiB |") == len(bench.available_ops())
    assert "MPICH" in text and "np.copyto" in text
    png = tmp_path / "docs" / "benchmarks.png"
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        assert "matplotlib is not installed" in proc.stdout and not png.exists()
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "![busbw against message size](benchmarks.png)" in text


def test_benchmarks_md_without_matplotlib(np2, tmp_path):
    _, _, out = np2
    hide = tmp_path / "hide"
    (hide / "matplotlib").mkdir(parents=True)
    (hide / "matplotlib" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    md = tmp_path / "BENCHMARKS.md"
    proc = run([sys.executable, SCRIPT, str(out), "-o", str(md)], env=dict(os.environ, PYTHONPATH=str(hide)))
    assert "matplotlib is not installed: no plot written" in proc.stdout
    assert not (tmp_path / "benchmarks.png").exists() and "![" not in md.read_text()


def test_benchmarks_md_rejects_other_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": 3}')
    proc = run([sys.executable, SCRIPT, str(bad), "-o", str(tmp_path / "B.md")], expect_rc=2)
    assert "is not fastring-bench --json output" in proc.stderr


# ---------------------------------------------------------------------------- asv suite

ASV_DIR = ROOT / "asv_benchmarks"
BENCH_MODULES = sorted(p.stem for p in (ASV_DIR / "benchmarks").glob("bench_*.py"))


def asv_classes():
    """(module, class) for every benchmark class, imported as asv imports them."""
    sys.path.insert(0, str(ASV_DIR))
    try:
        for name in BENCH_MODULES:
            module = importlib.import_module(f"benchmarks.{name}")
            for cname, cls in vars(module).items():
                if inspect.isclass(cls) and not cname.startswith("_") and cls.__module__ == module.__name__:
                    yield module, cls
    finally:
        sys.path.remove(str(ASV_DIR))


def test_asv_config_is_valid_json_with_comments():
    for conf in ("asv.conf.json", "asv.virtualenv.conf.json"):
        text = "\n".join(line for line in (ASV_DIR / conf).read_text().splitlines()
                         if not line.lstrip().startswith("//"))
        cfg = json.loads(text)
        assert cfg["repo"] == ".." and cfg["benchmark_dir"] == "benchmarks"
    assert BENCH_MODULES == ["bench_collectives", "bench_compression", "bench_fusion", "bench_kernels"]
    modules = {module.__name__: module for module, _ in asv_classes()}
    assert modules["benchmarks.bench_collectives"].OPS == list(bench.OPS)  # the suite's own copy


def test_asv_benchmarks_run(monkeypatch):
    """setup (and setup_cache) then every track_/time_ function once, for every parameter
    combination; each must return a positive finite number."""
    for module, cls in asv_classes():
        if hasattr(module, "SWEEP"):  # fewer iterations than a real asv run
            monkeypatch.setattr(module, "SWEEP", [*module.SWEEP, "--iters", "3", "--warmup", "1"])
        methods = [m for m in dir(cls) if m.startswith(("time_", "track_"))]
        assert methods, cls
        cache = [cls().setup_cache()] if hasattr(cls, "setup_cache") else []
        params = cls.params if isinstance(cls.params[0], list) else [cls.params]
        ran = 0
        for combo in itertools.product(*params):
            obj = cls()
            try:
                obj.setup(*cache, *combo)
            except NotImplementedError:  # asv skips what this fastring lacks
                continue
            for m in methods:
                value = getattr(obj, m)(*cache, *combo)
                assert m.startswith("time_") or (math.isfinite(value) and value > 0), (cls, m, combo, value)
            ran += 1
        assert ran, f"every parameter combination of {cls.__name__} was skipped"


@pytest.mark.skipif(shutil.which("asv", path=BIN) is None, reason="asv is not installed")
def test_asv_check():
    proc = run([os.path.join(BIN, "asv"), "check", "--python=same"], cwd=ASV_DIR, timeout=120)
    assert "No problems found" in proc.stdout


def test_one_host_scripts(tmp_path):
    """scripts/bench_shm.py (issue 18's figures) and scripts/bench_ways.py on 2 ranks at small
    sizes: every row, in order, with a ratio and the CPU's model, the summary of two launches,
    and each way of each collective against MPI."""
    from conftest import run_script
    rows_json = tmp_path / "shm.json"
    run_script(ROOT / "scripts" / "bench_shm.py", "--sizes", "4K", "--collectives", "64K", "--no-floor",
               "--json", rows_json)
    rows = json.loads(rows_json.read_text())
    others = ["allgather", "reducescatter", "broadcast", "alltoall"]
    assert [(r["what"], r["bytes"], r["barrier"]) for r in rows] == (
        [("allreduce", 4096, False), ("allreduce", 4096, True), ("grouped_allreduce 100 x 40 KB", 4_000_000, False)]
        + [(what, 65536, False) for what in others])
    assert all(r["ratio"] > 0 and r["cpu"] == bench.cpu_model() for r in rows)
    summary = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_shm.py"), "--summarize",
                              str(rows_json), str(rows_json)], capture_output=True, text=True, check=True).stdout
    assert f"CPU: {bench.cpu_model()}" in summary and "| allreduce | 4 KiB | no |" in summary
    lines = [line for line in run_script(ROOT / "scripts" / "bench_ways.py", "--sizes", "64K,128K").stdout.splitlines()
             if not line.startswith("#")]
    barrier, small, large = lines[0], lines[1:6], lines[6:]
    assert barrier.split()[0] == "barrier" and " fastring " in barrier and " MPI " in barrier
    for ways in (small, large):
        assert [line.split()[0] for line in ways] == ["broadcast", "allgather", "alltoall", "reducescatter", "allreduce"]
        assert all(" stream " in line and " single copy " in line and " MPI " in line for line in ways[:3])
        assert [" direct " in line for line in ways[:3]] == [False, True, True]  # results in the area
        assert " cached " in ways[3] and " streaming " in ways[3] and " MPI " in ways[3]
    # 64 KiB rides the negotiation cycle: its payload's stores; 128 KiB the segment's stores
    assert " plain cycle " in small[4] and " streaming cycle " in small[4] and " MPI " in small[4]
    assert " cached " in large[4] and " streaming " in large[4] and " MPI " in large[4]


def test_one_host_summary_says_where_the_floor_misses_the_target(tmp_path):
    """bench_shm.py --summarize on launches with floor rows: each side's share of the floor,
    and, per launch, MPI's time over the floor's (the most any code could reach there), with the
    launches in which even that is below the target counted."""
    def launch(mpi_us: float, floor_us: float) -> list[dict]:
        return [{"what": "allgather", "bytes": 16 << 20, "barrier": False, "fastring_us": 1000.0,
                 "mpi_us": mpi_us, "ratio": mpi_us / 1000.0, "floor_us": floor_us,
                 "fastring_floor_pct": 100 * floor_us / 1000.0, "mpi_floor_pct": 100 * floor_us / mpi_us,
                 "floors_us": [2 * floor_us, floor_us, floor_us], "cpu": "test"}]
    paths = []
    for k, (mpi_us, floor_us) in enumerate([(1400.0, 1000.0), (1800.0, 900.0), (1600.0, 1000.0)]):
        paths.append(tmp_path / f"{k}.json")
        paths[-1].write_text(json.dumps(launch(mpi_us, floor_us)))
    summary = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_shm.py"), "--summarize", *map(str, paths)],
                             capture_output=True, text=True, check=True).stdout
    assert "| allgather | 16 MiB | no | 1.40 | 1.60 | 1.40, 1.80, 1.60 | 1.5 (missed) |" in summary
    # floors 100%, 90%, 100% of fastring's time; MPI/floor 1.40, 2.00, 1.60: one launch below 1.5
    assert "| allgather | 16 MiB | 90% / 100% | 50% / 62% | 1.40 / 1.60 | 1 of 3 | 2000 / 1000 / 1000 |" in summary


def test_per_call_script(tmp_path):
    """scripts/bench_percall.py on 2 ranks: the allreduce with and without the caller's barrier
    and unnamed, barrier, the other collectives at 64 B and 4 KiB, each against MPI, then the
    grouped call and the torch rows (the asynchronous batch alone and back to back), and the
    summary of two launches."""
    pytest.importorskip("torch")
    from conftest import run_script
    rows_json = tmp_path / "percall.json"
    run_script(ROOT / "scripts" / "bench_percall.py", "--json", rows_json)
    rows = json.loads(rows_json.read_text())
    others = [(what, size) for size in (64, 4096) for what in ("broadcast", "allgather", "reducescatter", "alltoall")]
    assert [(r["what"], r["bytes"]) for r in rows[:4 + len(others)]] == (
        [("allreduce", 4096), ("allreduce", 4096), ("allreduce, unnamed", 4096), ("barrier", 0)] + others)
    assert all(r["ratio"] > 0 for r in rows if "ratio" in r) and [r["barrier"] for r in rows[:3]] == [False, True, False]
    assert [r["what"] for r in rows[4 + len(others):]] == [
        "grouped_allreduce 100 x 40 KB", "allreduce_async + synchronize, 100 x 100 float32",
        "the same, 50 batches back to back", "synchronous allreduce, 100 float32"]
    summary = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_percall.py"), "--summarize",
                              str(rows_json), str(rows_json)], capture_output=True, text=True, check=True).stdout
    assert "| barrier | 0 B | no |" in summary and "| alltoall | 64 B | no |" in summary
