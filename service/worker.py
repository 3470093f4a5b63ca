"""Queue infrastructure: the Celery app, `enqueue_training` (and pre-flights', evaluations')
and `queue_depth`.

It imports only the settings and the embedded broker (as polar's `polar/worker`): the API
enqueues wake-ups through it without loading torch, and each domain owns its tasks
(`service.training.tasks`, named in `include`, imported by the worker process only). The broker
message is only a wake-up; the job row and its lease are the truth. So tasks ack early,
prefetch one message at a time, and a worker trains one job per GPU (`-c 1`).
"""

from __future__ import annotations

from celery import Celery

from service.core import filesystem_broker
from service.settings import Settings, get_settings

TRAIN_TASK = "grpo.train_job"
PREFLIGHT_TASK = "grpo.preflight"
EVALUATION_TASK = "grpo.evaluation"


def make_celery(settings: Settings) -> Celery:
    app = Celery("grpo", broker=settings.effective_broker_url, include=["service.training.tasks"])
    # A broker that is down must not hang a request: fail fast, the reconciler re-enqueues.
    transport_options: dict[str, object] = {"socket_connect_timeout": 3, "socket_timeout": 10}
    if settings.broker_url is None:
        # Embedded mode: kombu's filesystem transport (messages written whole: see
        # filesystem_broker), a folder shared by the API and the worker.
        app.conf.broker_transport = filesystem_broker.TRANSPORT
        folder = settings.broker_folder
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        transport_options = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            # kombu's default is ./control, in whatever directory the process started from
            "control_folder": str(folder / "control"),
            "store_processed": False,
            # how often a worker lists the queue folder: a job starts within this
            "polling_interval": 0.5,
        }
    app.conf.update(
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=3,
        task_publish_retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.5},
        task_ignore_result=True,
        task_acks_late=False,
        worker_prefetch_multiplier=1,
        task_default_queue="gpu",
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    return app


def get_celery() -> Celery:
    """The Celery app of the broker in force: one per broker URL, as the engines are one per
    database (`service.core.db.get_engine`)."""
    settings = get_settings()
    # The embedded broker's URL is the same for every data folder: its folder tells them apart.
    broker = settings.broker_url or f"filesystem:{settings.broker_folder}"
    app = _celery_apps.get(broker)
    if app is None:  # two threads may each make one: the first stored is used
        app = _celery_apps.setdefault(broker, make_celery(settings))
    return app


_celery_apps: dict[str, Celery] = {}


def celery_queue(queue: str, devices: int = 1) -> str:
    """The broker queue of a job of `queue` that trains on `devices` devices: the queue itself
    for one device (as before), `gpu.x2` for two. A worker owning N devices consumes the classes
    1..N (`device_classes`), so the broker hands a job only to a worker it fits. The name uses
    only characters kombu's filesystem transport (embedded mode) accepts as well as Redis
    (`gpu@2` killed an embedded worker at start), and the settings refuse a declared queue
    ending in `.x<N>` (`settings.workers.QUEUE_NAME_RESERVED`): no class collides with a queue."""
    return queue if devices <= 1 else f"{queue}.x{devices}"


def device_classes(queue: str, devices: int) -> list[str]:
    """The broker queues a worker of `queue` owning `devices` devices consumes."""
    return [celery_queue(queue, n) for n in range(1, devices + 1)]


def enqueue_training(job_id: str, queue: str = "gpu", devices: int = 1) -> None:
    get_celery().send_task(TRAIN_TASK, args=[job_id], queue=celery_queue(queue, devices))


def enqueue_preflight(preflight_id: str, queue: str = "gpu") -> None:
    get_celery().send_task(PREFLIGHT_TASK, args=[preflight_id], queue=queue)


def enqueue_evaluation(evaluation_id: str, queue: str = "gpu") -> None:
    get_celery().send_task(EVALUATION_TASK, args=[evaluation_id], queue=queue)


# `celery -A service.worker worker` looks for this name.
app = get_celery()


def queue_depth(queue: str) -> int | None:
    """Messages waiting in a queue (None when the broker cannot tell)."""
    try:
        with get_celery().connection_for_read() as conn:
            channel = conn.default_channel
            # kombu's virtual transports (Redis, filesystem) count without declaring: after a
            # Redis flush the queue does not exist at all, and that must read as empty.
            size = getattr(channel, "_size", None)
            if size is not None:
                return int(size(queue))
            return int(channel.queue_declare(queue=queue, passive=True).message_count)
    except Exception:
        return None
