"""The process pool (bpfree.bench.parallel) and figure saving (bpfree.plotting) the benchmarks share."""

from __future__ import annotations

import math
import sys

import pytest

from bpfree.plotting import pyplot, save_figure
from bpfree.bench import parallel
from bpfree.bench.parallel import default_workers, run_keyed, spawn_pool


def test_run_keyed_in_process_and_in_a_spawn_pool_agree():
    tasks = {"a": 4.0, "b": 9.0, ("c", 1): 16.0}
    local = run_keyed(math.sqrt, tasks, workers=1)
    pooled = run_keyed(math.sqrt, tasks, workers=2, order=[("c", 1), "a", "b"])
    assert local == pooled == {"a": 2.0, "b": 3.0, ("c", 1): 4.0}


def test_run_keyed_propagates_a_task_error():
    with pytest.raises(ValueError, match="math domain error"):
        run_keyed(math.sqrt, {"ok": 1.0, "bad": -1.0}, workers=1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="every task key"):
        run_keyed(math.sqrt, {"a": 1.0}, workers=1, order=["a", "b"])
    with pytest.raises(ValueError, match="workers must be >= 1"):
        spawn_pool(0)
    with pytest.raises(ValueError, match="limit must be >= 1"):
        default_workers(0)


@pytest.mark.parametrize("cores, limit, expected", [(16, 2, 2), (1, 2, 1), (None, 4, 1),
                                                    (3, 8, 3)])
def test_default_workers_is_the_cores_there_are_at_most_the_limit(monkeypatch, cores, limit,
                                                                  expected):
    # os.cpu_count() returns None where the count is unknown: one worker then
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: cores)
    assert default_workers(limit) == expected


def test_save_figure_writes_a_png_and_returns_the_relative_path(tmp_path):
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    rel = save_figure(fig, tmp_path / "sub" / "f.png", root=tmp_path)
    assert str(rel) == "sub/f.png"
    assert (tmp_path / rel).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.get_fignums()          # closed, so long benchmarks do not leak figures


def test_pool_device_names_the_worker_layout():
    from bpfree.bench.environment import cpu_model
    from bpfree.bench.parallel import pool_device

    assert pool_device(2) == f"cpu: {cpu_model()}, 2 worker processes x 1 thread"


def _total(tensors) -> float:
    return float(sum(t.sum() for t in tensors))


def test_run_keyed_many_tensor_tasks_through_a_pool():
    """Tasks are fed to the pool a few at a time (bounded in flight); every result still
    comes back under its key, tensors and all."""
    import torch

    tasks = {i: [torch.full((8,), float(i)) for _ in range(4)] for i in range(300)}
    out = run_keyed(_total, tasks, workers=2)
    assert out == {i: 32.0 * i for i in range(300)}


def _bump(weight) -> dict:
    weight.add_(1.0)        # in place, as a weight perturbation is (never restored here)
    return {"sum": float(weight.sum())}


def _bump_task(task):
    return parallel.run_named_task({"bump": _bump}, task, seconds_key="seconds")


def test_a_pool_task_changes_its_own_copy_not_the_shared_tensor():
    """A tensor sent to a spawn pool shares its storage with the parent and every other task
    that got it; run_named_task runs each task on a deep copy, so an in-place change in one
    task is seen by no other and not by the parent (PMT's Fig. 5 cosine tasks, perturbing
    one shared model side by side, made each other's estimates wrong)."""
    import torch

    shared = torch.zeros(4)
    tasks = {i: ("bump", {"weight": shared}) for i in range(4)}
    out = run_keyed(_bump_task, tasks, workers=2)
    assert [out[i]["sum"] for i in range(4)] == [4.0] * 4
    assert torch.equal(shared, torch.zeros(4))
    assert run_keyed(_bump_task, tasks, workers=1)[0]["sum"] == 4.0
    assert torch.equal(shared, torch.zeros(4))


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux-only")
def test_pool_workers_end_when_the_parent_is_killed(tmp_path):
    """SIGKILL to a benchmark's main process alone must not leave its workers running."""
    import signal
    import subprocess
    import time

    script = tmp_path / "parent.py"
    pids = tmp_path / "pids.txt"
    script.write_text(
        "import os, time\n"
        "from bpfree.bench.parallel import spawn_pool\n"
        "if __name__ == '__main__':\n"
        "    with spawn_pool(2) as pool:\n"
        "        futs = [pool.submit(os.getpid) for _ in range(4)]\n"
        f"        open({str(pids)!r}, 'w').write(' '.join(str(f.result()) for f in futs))\n"
        "        pool.submit(time.sleep, 60)\n"
        "        time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, str(script)])
    # Generous: on a loaded 2-core machine two spawned workers importing torch took > 60 s.
    deadline = time.time() + 240
    while not pids.exists() or not pids.read_text().strip():
        assert time.time() < deadline, "the pool never started"
        time.sleep(0.2)
    workers = {int(p) for p in pids.read_text().split()}
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while any(_alive(p) for p in workers) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in workers)


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie has finished
        return fh.read().split()[2] != "Z"


def test_spawned_workers_import_the_benchmark_helper_modules():
    """The experiment drivers live in benchmarks/_*.py, not in the library: a spawn pool's
    workers must unpickle their task functions, which they can only through the sys.path entry
    share_helpers added in the parent (tests/conftest.py, as `bpfree bench` does)."""
    import _tinyfoa_experiment as driver

    out = run_keyed(driver.n_classes, {"a": "mitbih", "b": "fashion"}, workers=2)
    assert out == {"a": 5, "b": 10}


def test_a_cut_off_run_resumes_from_its_finished_tasks(tmp_path):
    from bpfree.bench.task_cache import TaskCache

    calls = []

    def train(task):
        calls.append(task)
        if task == "boom":
            raise RuntimeError("the session ended")
        return {"acc": len(task)}

    tasks = {"a": "x", "b": "yy", "c": "boom"}
    cache = TaskCache(tmp_path, salt="rev1")
    with pytest.raises(RuntimeError, match="session ended"):
        run_keyed(train, tasks, workers=1, order=["a", "b", "c"], cache=cache)
    assert len(list(tmp_path.glob("*.pkl"))) == 2          # a and b were kept as they finished
    calls.clear()
    tasks["c"] = "zzz"                                      # the resumed run finishes
    again = TaskCache(tmp_path, salt="rev1")
    out = run_keyed(train, tasks, workers=1, cache=again)
    assert out == {"a": {"acc": 1}, "b": {"acc": 2}, "c": {"acc": 3}}
    assert calls == ["zzz"] and again.hits == 2
    # another revision, or a task that differs, never reuses a result
    calls.clear()
    run_keyed(train, {"a": "x"}, workers=1, cache=TaskCache(tmp_path, salt="rev2"))
    assert calls == ["x"]
    # a cut-off (corrupt) file counts as missing and is rewritten
    path = again.path(train, "yy")
    path.write_bytes(path.read_bytes()[:5])
    calls.clear()
    assert run_keyed(train, {"b": "yy"}, workers=1, cache=again) == {"b": {"acc": 2}}
    assert calls == ["yy"]


_DIGEST_SCRIPT = """
import torch
from torch import nn
from bpfree.bench.task_cache import task_digest
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 3))
model.register_buffer("steps", torch.arange(5, dtype=torch.int8))
data = (torch.rand(6, 1, 8, 8), torch.randint(0, 3, (6,)))
print(task_digest(("train", dict(model=model, data=data, tags={"alpha", "beta", "gamma"},
                                 lr=0.1))))
"""


def test_a_task_holding_a_model_has_the_same_cache_key_in_every_process():
    """A resumed run is a new process: the key of a task holding tensors and a module must not
    depend on the process (a plain pickle of a tensor embeds torch.save's fresh serialization
    id, and a set pickles in per-process hash order), or no result is ever found again."""
    import os
    import subprocess
    import sys

    def digest(hash_seed: str) -> str:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", _DIGEST_SCRIPT], env=env, check=True,
                             capture_output=True, text=True)
        return out.stdout.strip()

    first, second = digest("1"), digest("2")
    assert len(first) == 64 and first == second


def test_the_task_digest_follows_every_tensor_byte_and_setting():
    import torch
    from torch import nn

    from bpfree.bench.task_cache import task_digest

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    base = task_digest(("t", model, 0.1))
    assert task_digest(("t", model, 0.1)) == base
    assert task_digest(("t", model, 0.2)) != base                 # a setting
    with torch.no_grad():
        model.weight[1, 2] += 1e-7                                 # one weight's last bits
    assert task_digest(("t", model, 0.1)) != base
    x = torch.zeros(4)
    assert task_digest(x) != task_digest(x.to(torch.float64))       # dtype
    assert task_digest(x) != task_digest(x.reshape(2, 2))           # shape
    assert task_digest(torch.arange(6)[::2]) == task_digest(torch.tensor([0, 2, 4]))  # a view
    assert task_digest({"b", "a"}) == task_digest({"a", "b"})


def test_a_pool_run_stores_each_result_and_reuses_it(tmp_path):
    from bpfree.bench.task_cache import TaskCache

    tasks = {"a": 4.0, "b": 9.0}
    cache = TaskCache(tmp_path, salt="r")
    assert run_keyed(math.sqrt, tasks, workers=2, cache=cache) == {"a": 2.0, "b": 3.0}
    for name in ("a", "b"):             # plant a different value: the cache, not sqrt, answers
        cache.store(math.sqrt, tasks[name], -1.0)
    reused = TaskCache(tmp_path, salt="r")
    assert run_keyed(math.sqrt, tasks, workers=2, cache=reused) == {"a": -1.0, "b": -1.0}
    assert reused.hits == 2


def test_the_task_cache_needs_a_clean_committed_checkout(tmp_path, monkeypatch):
    import subprocess

    from bpfree.bench import task_cache

    monkeypatch.delenv(task_cache.ENV, raising=False)
    assert task_cache.from_environment(tmp_path) is None
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(git + ["init", "-q"], check=True)
    (repo / "code.py").write_text("x = 1\n")
    subprocess.run(git + ["add", "code.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    monkeypatch.setenv(task_cache.ENV, str(tmp_path / "cache"))
    cache = task_cache.from_environment(repo)
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert cache.salt == head and cache.directory.is_dir()
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(ValueError, match="dirty"):
        task_cache.from_environment(repo)
    monkeypatch.setenv(task_cache.ENV, str(repo / "code.py"))
    subprocess.run(git + ["checkout", "-q", "code.py"], check=True)
    with pytest.raises(ValueError, match="not a directory"):
        task_cache.from_environment(repo)


def test_a_report_only_cache_reads_another_revisions_run_and_trains_nothing(tmp_path,
                                                                           monkeypatch):
    """$BPFREE_TASK_CACHE_REPORT=REV: the results REV's run stored, read by a newer commit;
    unfinished tasks are left out (partial=True) or refused, and nothing is written."""
    import subprocess

    from bpfree.bench import task_cache
    from bpfree.bench.task_cache import PartialRunError, TaskCache

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(git + ["init", "-q"], check=True)
    for text in ("x = 1\n", "x = 2\n"):
        (repo / "code.py").write_text(text)
        subprocess.run(git + ["add", "code.py"], check=True)
        subprocess.run(git + ["commit", "-qm", text], check=True)
    old = subprocess.run(git + ["rev-parse", "--short", "HEAD~1"], capture_output=True,
                         text=True, check=True).stdout.strip()
    folder = tmp_path / "cache"
    calls = []

    def train(task):
        calls.append(task)
        return len(task)

    run_keyed(train, {"a": "x"}, workers=1, cache=TaskCache(folder, salt=old))  # the old run
    monkeypatch.setenv(task_cache.ENV, str(folder))
    monkeypatch.setenv(task_cache.REPORT_ENV, "HEAD~1")
    report = task_cache.from_environment(repo)
    assert report.report_only and report.salt == old
    calls.clear()
    before = sorted(p.name for p in folder.iterdir())
    assert run_keyed(train, {"a": "x", "b": "yy"}, workers=2, cache=report,
                     partial=True) == {"a": 1}
    assert calls == [] and report.hits == 1 and report.missing == 1
    assert sorted(p.name for p in folder.iterdir()) == before
    with pytest.raises(PartialRunError, match="1 of 2 tasks of phase one have not finished"):
        run_keyed(train, {"a": "x", "b": "yy"}, workers=1, cache=report, progress="phase one")
    assert calls == []
    # a revision that is not a commit, a missing folder, or no cache at all: clear errors
    monkeypatch.setenv(task_cache.REPORT_ENV, "no-such-rev")
    with pytest.raises(ValueError, match="not a commit of this repository"):
        task_cache.from_environment(repo)
    monkeypatch.setenv(task_cache.REPORT_ENV, "HEAD~1")
    monkeypatch.setenv(task_cache.ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="does not exist; nothing to report"):
        task_cache.from_environment(repo)
    assert not (tmp_path / "nowhere").exists()
    monkeypatch.delenv(task_cache.ENV)
    with pytest.raises(ValueError, match="name the cache folder"):
        task_cache.from_environment(repo)


def test_memoized_runs_a_task_once_per_revision(tmp_path):
    from bpfree.bench.task_cache import TaskCache, memoized

    calls = []

    def train(task):
        calls.append(task)
        return {"mse": task[1] * 2.0}

    cache = TaskCache(tmp_path, salt="rev1")
    task = ("ZO", 3)
    assert memoized(cache, train, task, lambda: train(task)) == {"mse": 6.0}
    # a second run of the same revision reads the stored result and does not train
    again = TaskCache(tmp_path, salt="rev1")
    assert memoized(again, train, task, lambda: train(task)) == {"mse": 6.0}
    assert calls == [task] and again.hits == 1
    # another task, another revision, or no cache at all: trained
    memoized(again, train, ("ZO", 4), lambda: train(("ZO", 4)))
    memoized(TaskCache(tmp_path, salt="rev2"), train, task, lambda: train(task))
    memoized(None, train, task, lambda: train(task))
    assert calls == [task, ("ZO", 4), task, task]
    # a report-only cache reads what its revision stored and writes nothing it computes
    files = sorted(tmp_path.iterdir())
    report = TaskCache(tmp_path, salt="rev1", report_only=True)
    assert memoized(report, train, task, lambda: train(task)) == {"mse": 6.0}
    assert memoized(report, train, ("ZO", 5), lambda: train(("ZO", 5))) == {"mse": 10.0}
    assert calls[-1] == ("ZO", 5) and sorted(tmp_path.iterdir()) == files


def test_a_run_goes_on_at_a_newer_revision_reusing_an_ancestors_results(tmp_path,
                                                                        monkeypatch):
    """$BPFREE_TASK_CACHE_REUSE=REV: a task this revision has no result for takes REV's, and
    only the rest is trained, under this revision's keys; each reused result's origin is
    recorded. REV must be an ancestor, and excludes a report."""
    import subprocess

    from bpfree.bench import task_cache
    from bpfree.bench.task_cache import TaskCache

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(git + ["init", "-q"], check=True)
    revs = []
    for text in ("x = 1\n", "x = 2\n"):
        (repo / "code.py").write_text(text)
        subprocess.run(git + ["add", "code.py"], check=True)
        subprocess.run(git + ["commit", "-qm", text], check=True)
        revs.append(subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                                   text=True, check=True).stdout.strip())
    folder = tmp_path / "cache"
    calls = []

    def train(task):
        calls.append(task)
        return len(task)

    run_keyed(train, {"a": "x"}, workers=1, cache=TaskCache(folder, salt=revs[0]))
    monkeypatch.setenv(task_cache.ENV, str(folder))
    monkeypatch.setenv(task_cache.REUSE_ENV, revs[0])
    cache = task_cache.from_environment(repo)
    assert cache.salt == revs[1] and cache.reuse == (revs[0],) and not cache.report_only
    calls.clear()
    assert run_keyed(train, {"a": "x", "b": "yy"}, workers=1, cache=cache) == {"a": 1, "b": 2}
    assert calls == ["yy"] and cache.reused == {revs[0]: 1}
    assert cache.origin == {cache.path(train, "x"): revs[0]}
    assert cache.path(train, "yy").is_file()  # new work is kept under the new revision
    assert not cache.path(train, "x").exists()  # and the old result is not copied
    # naming the checkout's own revision reuses nothing extra
    monkeypatch.setenv(task_cache.REUSE_ENV, "HEAD")
    assert task_cache.from_environment(repo).reuse == ()
    # a later revision, or a revision that is not a commit: refused
    subprocess.run(git + ["checkout", "-q", revs[0]], check=True)
    monkeypatch.setenv(task_cache.REUSE_ENV, revs[1])
    with pytest.raises(ValueError, match="is not an ancestor"):
        task_cache.from_environment(repo)
    monkeypatch.setenv(task_cache.REUSE_ENV, "no-such-rev")
    with pytest.raises(ValueError, match="REUSE='no-such-rev' is not a commit"):
        task_cache.from_environment(repo)
    # a partial report of the newer revision's run reads both revisions' results
    subprocess.run(git + ["checkout", "-q", revs[1]], check=True)
    monkeypatch.setenv(task_cache.REUSE_ENV, revs[0])
    monkeypatch.setenv(task_cache.REPORT_ENV, revs[1])
    report = task_cache.from_environment(repo)
    assert report.report_only and report.salt == revs[1] and report.reuse == (revs[0],)
    calls.clear()
    assert run_keyed(train, {"a": "x", "b": "yy", "c": "zzz"}, workers=1, cache=report,
                     partial=True) == {"a": 1, "b": 2}
    assert calls == [] and report.reused == {revs[0]: 1} and report.missing == 1
    monkeypatch.delenv(task_cache.ENV)
    monkeypatch.delenv(task_cache.REPORT_ENV)
    with pytest.raises(ValueError, match="REUSE is set but"):
        task_cache.from_environment(repo)


def test_same_result_names_every_difference_but_timings():
    import torch

    from bpfree.bench.task_cache import same_result

    a = {"accuracy": 91.5, "runs": [{"lr": 0.1, "loss": [2.0, 1.0]}], "seconds": 3.0,
         "w": torch.tensor([1, 2], dtype=torch.int8), "nan": float("nan"), "task_seconds": 1}
    assert same_result(a, {**a, "seconds": 9.0, "task_seconds": 2}) == []
    b = {**a, "runs": [{"lr": 0.1, "loss": [2.0, 1.5]}], "w": torch.tensor([1, 3],
                                                                          dtype=torch.int8)}
    assert same_result(a, b) == ["result['runs'][0]['loss'][1]: 1.0 != 1.5",
                                 "result['w']: tensors differ"]
    assert same_result(a, {**a, "extra": 1}) == ["result['extra'] only in the second"]
    assert same_result([1, 2], [1]) == ["result: lengths 2 and 1"]
    assert same_result(1, 1.0) == ["result: 1 != 1.0"]  # a type change is a difference


def test_cached_submit_runs_a_task_once_and_stores_it_as_it_arrives(tmp_path):
    """A benchmark that schedules its own tasks (bench qzo-ff) resumes through
    ``cached_submit``: a stored task comes back finished without running, a new one is
    stored when it finishes, a failed one is not, and a report-only cache refuses to run."""
    import concurrent.futures as cf

    from bpfree.bench.parallel import cached_submit
    from bpfree.bench.task_cache import PartialRunError, TaskCache

    calls = []

    def train(task):
        calls.append(task)
        if task == "boom":
            raise RuntimeError("diverged")
        return {"acc": len(task)}

    with cf.ThreadPoolExecutor(2) as pool:
        cache = TaskCache(tmp_path, salt="rev1")
        futures = [cached_submit(pool, cache, train, t) for t in ("x", "yy", "boom")]
        cf.wait(futures)
        assert [f.result() for f in futures[:2]] == [{"acc": 1}, {"acc": 2}]
        assert isinstance(futures[2].exception(), RuntimeError)
    assert len(list(tmp_path.glob("*.pkl"))) == 2  # the failed task stored nothing
    calls.clear()
    with cf.ThreadPoolExecutor(2) as pool:
        again = TaskCache(tmp_path, salt="rev1")
        done = cached_submit(pool, again, train, "yy")
        assert done.done() and done.result() == {"acc": 2}  # finished before it was awaited
        assert cached_submit(pool, again, train, "zzz").result() == {"acc": 3}
        assert cached_submit(pool, None, train, "yy").result() == {"acc": 2}  # no cache: runs
    assert calls == ["zzz", "yy"] and again.hits == 1
    report = TaskCache(tmp_path, salt="rev1", report_only=True)
    with cf.ThreadPoolExecutor(1) as pool:
        assert cached_submit(pool, report, train, "x").result() == {"acc": 1}
        with pytest.raises(PartialRunError, match="has not finished"):
            cached_submit(pool, report, train, "new")
    assert report.missing == 1 and calls == ["zzz", "yy"]


def test_priority_submitter_runs_the_lowest_priority_first_and_limits_the_pool(tmp_path):
    """Tasks wait in the submitter, not in the pool's FIFO queue: with one slot, a task added
    later at a lower priority number overtakes one already waiting; a cached task takes no
    slot; a report-only cache lists an optional missing task instead of raising."""
    import concurrent.futures as cf
    import threading

    from bpfree.bench.parallel import PrioritySubmitter
    from bpfree.bench.task_cache import PartialRunError, TaskCache

    started, gate = [], threading.Event()

    def train(task):
        started.append(task)
        if task == "first":
            gate.wait(10)
        return task.upper()

    added = []
    with cf.ThreadPoolExecutor(4) as pool:
        cache = TaskCache(tmp_path, salt="rev1")
        feed = PrioritySubmitter(pool, cache, limit=1, on_add=added.append)
        feed.add(train, "first", "k1", priority=5)
        feed.add(train, "late-low", "k2", priority=9)
        feed.add(train, "late-high", "k3", priority=0)   # overtakes k2, which still waits
        assert sum(not f.done() for f in feed.futures) == 1
        gate.set()
        got = {}
        while feed:
            got.update(feed.completed())
    assert started == ["first", "late-high", "late-low"]
    assert got == {"k1": "FIRST", "k2": "LATE-LOW", "k3": "LATE-HIGH"}
    assert added == ["k1", "k2", "k3"]
    # read back: every task is cached, finishes at once and takes no slot
    started.clear()
    report = TaskCache(tmp_path, salt="rev1", report_only=True)
    with cf.ThreadPoolExecutor(1) as pool:
        feed = PrioritySubmitter(pool, report, limit=1)
        feed.add(train, "first", "k1")
        feed.add(train, "late-low", "k2")
        feed.add(train, "never-run", "k4", optional=True)
        got = {}
        while feed:
            got.update(feed.completed())
        assert got == {"k1": "FIRST", "k2": "LATE-LOW"} and feed.missing == ["k4"]
        with pytest.raises(PartialRunError, match="has not finished"):
            feed.add(train, "needed", "k5")
    assert started == []
    with pytest.raises(ValueError, match="limit must be >= 1"):
        PrioritySubmitter(None, None, limit=0)
