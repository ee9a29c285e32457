"""Celery against the broker: a real ``celery worker`` subprocess, tasks sent from the test process
over ``pyamqp://``, results through the ``rpc://`` result backend."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from celery import group

from tests.support.polling import eventually
from tqbroker.testing import running_broker

pytestmark = pytest.mark.timeout(60)

TASKS = textwrap.dedent(
    """
    import os
    from pathlib import Path

    from celery import Celery

    app = Celery("tq_celery_tasks", broker=os.environ["TQ_BROKER_URL"], backend="rpc://")
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=3,
        worker_hijack_root_logger=False,
        result_expires=60,
    )


    @app.task
    def add(x, y):
        return x + y


    @app.task
    def fail(message):
        raise ValueError(message)


    @app.task(bind=True, max_retries=3)
    def flaky(self, marker):
        # Fails the first time (retried with a countdown: an ETA message), then succeeds.
        path = Path(marker)
        if not path.exists():
            path.write_text("tried")
            raise self.retry(countdown=0.5)
        return f"ok after {self.request.retries} retries"


    @app.task(ignore_result=True)
    def touch(path, content):
        Path(path).write_text(content)
    """
)


class Worker:
    def __init__(self, module: ModuleType, log: Path) -> None:
        self.module = module
        self.log = log

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    tmp = tmp_path_factory.mktemp("celery")
    (tmp / "tq_celery_tasks.py").write_text(TASKS)
    with running_broker() as broker:
        url = f"pyamqp://guest:guest@{broker.host}:{broker.port}//"
        env = {
            **os.environ,
            "TQ_BROKER_URL": url,
            "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]),
        }
        log = tmp / "worker.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "tq_celery_tasks",
                    "worker",
                    "--pool=solo",
                    "-c",
                    "1",
                    "--without-gossip",
                    "--without-mingle",
                    "--loglevel=INFO",
                    "-n",
                    "tqworker@%h",
                ],
                cwd=tmp,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        old_url = os.environ.get("TQ_BROKER_URL")
        os.environ["TQ_BROKER_URL"] = url
        sys.path.insert(0, str(tmp))
        try:
            module = importlib.import_module("tq_celery_tasks")
            yield Worker(module, log)
        finally:
            sys.path.remove(str(tmp))
            sys.modules.pop("tq_celery_tasks", None)
            if old_url is None:
                os.environ.pop("TQ_BROKER_URL", None)
            else:
                os.environ["TQ_BROKER_URL"] = old_url
            if "module" in locals():
                # Close the test process's own connections (task producers, the rpc result
                # consumer) so the broker has no client left to wait for when it stops.
                module.app.backend.result_consumer.stop()
                module.app.pool.force_close_all()
                module.app.close()
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def test_task_round_trip_with_rpc_backend(worker: Worker) -> None:
    result = worker.module.add.delay(2, 3)
    try:
        assert result.get(timeout=30) == 5
    except Exception:
        print(worker.output())
        raise
    assert result.successful()
    assert result.state == "SUCCESS"

    results = [worker.module.add.delay(i, i) for i in range(10)]
    assert [r.get(timeout=30) for r in results] == [i * 2 for i in range(10)]


def test_task_error_propagates(worker: Worker) -> None:
    result = worker.module.fail.delay("task went wrong")
    try:
        with pytest.raises(ValueError, match="task went wrong"):
            result.get(timeout=30)
    except BaseException:
        print(worker.output())
        raise
    assert result.failed()
    assert result.state == "FAILURE"


def test_retry_with_countdown_and_eta_task(worker: Worker, tmp_path: Path) -> None:
    try:
        result = worker.module.flaky.delay(str(tmp_path / "marker"))
        assert result.get(timeout=30) == "ok after 1 retries"
        started = time.monotonic()
        eta = worker.module.add.apply_async((20, 22), countdown=1)
        assert eta.get(timeout=30) == 42
        assert time.monotonic() - started >= 0.9
    except BaseException:
        print(worker.output())
        raise


def test_group_of_tasks(worker: Worker) -> None:
    job = group(worker.module.add.s(i, 10) for i in range(5))
    try:
        assert job.apply_async().get(timeout=30) == [i + 10 for i in range(5)]
    except Exception:
        print(worker.output())
        raise


def test_worker_runs_task_without_result_backend(worker: Worker, tmp_path: Path) -> None:
    target = tmp_path / "done.txt"
    worker.module.touch.delay(str(target), "written by the worker")
    # The file may exist a moment before the worker has written it: wait for the content.
    try:
        eventually(
            lambda: target.read_text() == "written by the worker",
            30,
            ignoring=(FileNotFoundError,),
        )
    except AssertionError as error:
        raise AssertionError(worker.output()) from error


def test_control_ping_reaches_worker(worker: Worker) -> None:
    """``celery inspect ping``: a broadcast over the pidbox fanout exchange, replies through the
    ``reply.celery.pidbox`` direct exchange."""
    # The worker might still be starting: a task round trip proves it is consuming.
    assert worker.module.add.delay(1, 1).get(timeout=30) == 2
    replies = worker.module.app.control.ping(timeout=5, limit=1)
    assert len(replies) == 1, (replies, worker.output())
    assert any("tqworker@" in name for reply in replies for name in reply), (
        replies,
        worker.output(),
    )
    for reply in replies:
        for answer in reply.values():
            assert answer == {"ok": "pong"}
