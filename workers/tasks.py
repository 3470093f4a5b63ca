"""Celery tasks: thin adapters that pass ids and call plain functions."""

from workers.celery_app import TRAIN_TASK, app


@app.task(name=TRAIN_TASK)
def train_job(job_id: str) -> None:
    # Imported here so that the API, which imports this module's app, never loads torch.
    from workers.jobs.run import run_job

    run_job(job_id)
