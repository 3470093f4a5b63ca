"""`grpo-service report JOB_ID --out report.html`: one self-contained HTML file describing a
run (curves as inline SVG, spec, verifier versions and sha256, checkpoints, events), read
through the API so that it works against any deployment."""

from __future__ import annotations

import html
import json
import math
from datetime import UTC, datetime
from typing import Any

from grpo_client import Client, ClientError
from grpo_client.models import CheckpointOut, EventOut, JobOut

REWARD = (("reward_mean", "train", "#2563eb"), ("eval_reward_mean", "held-out", "#16a34a"))
CHARTS = (
    ("Reward mean", REWARD),
    ("KL to reference", (("kl", "KL", "#9333ea"),)),
    ("Loss", (("loss", "loss", "#dc2626"),)),
    ("Completion length", (("completion_len_mean", "tokens", "#0891b2"),)),
    ("Clip ratio", (("clip_ratio", "clip ratio", "#ea580c"),)),
    ("Entropy", (("entropy", "entropy", "#65a30d"),)),
    ("Gradient norm", (("grad_norm", "grad norm", "#be185d"),)),
    ("Step time (s)", (("step_seconds", "seconds", "#4b5563"),)),
)  # fmt: skip
W, H, ML, MR, MT, MB = 420, 200, 52, 12, 24, 26
esc = html.escape


def _fmt(v: float) -> str:
    return f"{v:.3g}" if v == 0 or 0.01 <= abs(v) < 1000 else f"{v:.1e}"


def _extent(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if lo == hi:
        pad = abs(lo) * 0.1 or 1.0
        return lo - pad, hi + pad
    return lo, hi


def svg_chart(title: str, series: list[tuple[str, str, list[tuple[float, float]]]]) -> str:
    """A line chart as an inline <svg>: series of (label, colour, [(step, value)])."""
    series = [(n, c, [p for p in pts if math.isfinite(p[1])]) for n, c, pts in series]
    points = [p for _, _, pts in series for p in pts]
    parts = [f'<svg viewBox="0 0 {W} {H}" role="img" aria-label="{esc(title)}">']
    if not points:
        parts.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no data</text></svg>')
        return "".join(parts)
    x0, x1 = _extent([p[0] for p in points])
    y0, y1 = _extent([p[1] for p in points])

    def sx(x: float) -> float:
        return ML + (x - x0) / (x1 - x0) * (W - ML - MR)

    def sy(y: float) -> float:
        return H - MB - (y - y0) / (y1 - y0) * (H - MT - MB)

    for i in range(5):
        y = y0 + (y1 - y0) * i / 4
        parts.append(f'<line x1="{ML}" x2="{W - MR}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" class="g"/>')
        parts.append(f'<text x="{ML - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{_fmt(y)}</text>')
    for x in sorted({min(p[0] for p in points), max(p[0] for p in points)}):
        parts.append(f'<text x="{sx(x):.1f}" y="{H - 8}" text-anchor="middle">{x:g}</text>')
    for i, (label, colour, pts) in enumerate(series):
        if not pts:
            continue
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        parts.append(
            f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2" '
            f'data-series="{esc(label)}" data-points="{len(pts)}"/>'
        )
        if len(series) > 1:
            parts.append(f'<rect x="{ML + i * 110}" y="4" width="10" height="10" fill="{colour}"/>')
            parts.append(f'<text x="{ML + i * 110 + 14}" y="13">{esc(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(headers: list[str], rows: list[list[Any]], row_class: list[str] | None = None) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        f'<tr class="{(row_class or [""] * len(rows))[i]}">'
        + "".join(f"<td>{esc('' if v is None else str(v))}</td>" for v in row)
        + "</tr>"
        for i, row in enumerate(rows)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE = """
body{font:14px/1.45 system-ui,sans-serif;color:#111827;max-width:1320px;margin:24px auto;
padding:0 20px}h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:5px 9px;border-bottom:1px solid #e5e7eb}
th{background:#f3f4f6}tr.warn td{background:#fef2f2;color:#991b1b;font-weight:600}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(400px,1fr));gap:14px}
figure{margin:0;border:1px solid #e5e7eb;border-radius:8px;padding:8px}figcaption{font-weight:600}
svg{width:100%;height:auto}svg text{font-size:11px;fill:#6b7280}svg .g{stroke:#eef0f3}
.banner{background:#b91c1c;color:#fff;padding:12px 16px;border-radius:8px}
pre{background:#f9fafb;border:1px solid #e5e7eb;padding:12px;overflow:auto;font-size:12px}
code,td.mono{font-family:ui-monospace,monospace;font-size:12px}
"""


def _series(metrics: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    return [(r["step"], r[key]) for r in metrics if isinstance(r.get(key), int | float)]


def _charts(metrics: list[dict[str, Any]]) -> str:
    return "".join(
        f"<figure><figcaption>{esc(title)}</figcaption>"
        + svg_chart(title, [(label, colour, _series(metrics, k)) for k, label, colour in defs])
        + "</figure>"
        for title, defs in CHARTS
    )


def _summary(job: JobOut, metrics: list[dict[str, Any]]) -> list[list[Any]]:
    rewards = [y for _, y in _series(metrics, "reward_mean")]
    held_out = [y for _, y in _series(metrics, "eval_reward_mean")]
    rows = [
        ["status", job.status],
        ["steps", f"{job.step}/{job.total_steps}"],
        ["base model", job.spec.get("base_model")],
        ["created", job.created_at.isoformat()],
        ["started", job.started_at and job.started_at.isoformat()],
        ["finished", job.finished_at and job.finished_at.isoformat()],
        ["final reward mean", rewards[-1] if rewards else None],
        ["best reward mean", max(rewards, default=None)],
        ["final held-out reward", held_out[-1] if held_out else None],
        ["error", job.error and f"{job.error.code}: {job.error.message}"],
    ]
    return [[k, f"{v:.4g}" if isinstance(v, float) else v] for k, v in rows if v is not None]


SAMPLES_EACH_END = 3  # the best and the worst completions of the last step shown
MAX_SAMPLE_ROWS = 2000  # rows of that step read at most


def _samples(rows: list[Any]) -> str:
    """The last stored step's best and worst completions, with their scores and advantages."""
    if not rows:
        return (
            "<p>No rollouts stored for this job (its spec says <code>rollouts: none</code>, or "
            "it has not trained a step yet).</p>"
        )
    ranked = sorted(rows, key=lambda r: r.reward, reverse=True)
    picked = ranked[:SAMPLES_EACH_END] + ranked[SAMPLES_EACH_END:][-SAMPLES_EACH_END:]
    table = [
        [r.group, r.index, f"{r.reward:.3g}", None if r.advantage is None else f"{r.advantage:.3g}",
         ", ".join(f"{k}={'error' if v is None else f'{v:.3g}'}" for k, v in r.scores.items()),
         r.prompt[-200:], r.completion[:600]]
        for r in picked
    ]  # fmt: skip
    mean = sum(r.reward for r in rows) / len(rows)
    head = (
        f"<p>Step {rows[0].step}: {len(rows)} completions, reward mean {mean:.4g}; "
        f"the {SAMPLES_EACH_END} best and the {SAMPLES_EACH_END} worst.</p>"
    )
    columns = ["group", "#", "reward", "advantage", "scores", "prompt (end)", "completion"]
    return head + _table(columns, table)


def render_report(
    job: JobOut,
    metrics: list[dict[str, Any]],
    events: list[EventOut],
    checkpoints: list[CheckpointOut],
    verifiers: list[dict[str, Any]],
    samples: list[Any] | None = None,
) -> str:
    """The report as one HTML string (no external resources)."""
    alarms = [e for e in events if e.type == "reward_hacking_suspected"]
    banner = ""
    if alarms:
        message = esc(alarms[-1].message)
        banner = f'<p class="banner"><strong>Reward hacking suspected</strong>: {message}</p>'
    ver_rows = [
        [v["role"], v["name"], v.get("version"), v.get("weight"), v.get("kind"), v.get("sha256")]
        for v in verifiers
    ]
    ckpt_rows = [[c.step, c.format, c.size_bytes, c.sha256, c.id] for c in checkpoints]
    ev_rows = [[e.at.isoformat(), e.type, e.message] for e in events]
    ev_class = ["warn" if e.type == "reward_hacking_suspected" else "" for e in events]
    generated = datetime.now(UTC).isoformat(timespec="seconds")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(job.id)} · GRPO run report</title>
<style>{STYLE}</style></head><body>
<h1>GRPO run {esc(job.id)}</h1>
<p>Generated {generated} by grpo-service.</p>
{banner}
{_table(["", ""], _summary(job, metrics))}
<h2>Curves</h2><div class="charts">{_charts(metrics)}</div>
<h2>Samples</h2>{_samples(samples or [])}
<h2>Verifiers</h2>{_table(["role", "name", "version", "weight", "kind", "sha256"], ver_rows)}
<h2>Checkpoints</h2>{_table(["step", "format", "bytes", "sha256", "id"], ckpt_rows)}
<h2>Events</h2>{_table(["at", "type", "message"], ev_rows, ev_class)}
<h2>Spec</h2><pre>{esc(json.dumps(job.spec, indent=2))}</pre>
</body></html>
"""


def _verifiers(client: Client, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The pinned verifier references of the spec, with kind and sha256 from the API."""
    out = []
    for role in ("verifiers", "eval_verifiers"):
        for ref in spec.get(role) or []:
            row = {"role": role.removesuffix("s"), **ref}
            try:
                found = client.verifiers.get(ref["name"], ref.get("version"))
                row.setdefault("sha256", found.sha256)
                row["kind"] = found.kind
            except ClientError:  # not readable any more: keep what the spec says
                row.setdefault("kind", None)
            out.append(row)
    return out


def build_report(client: Client, job_id: str) -> str:
    """Read the job, its metrics, events, checkpoints and verifiers; render the report."""
    job = client.jobs.get(job_id)
    return render_report(
        job,
        client.jobs.metrics(job_id),
        client.jobs.events(job_id),
        client.checkpoints.list(job_id),
        _verifiers(client, job.spec),
        _last_step_rollouts(client, job),
    )


def _last_step_rollouts(client: Client, job: JobOut) -> list[Any]:
    if job.step < 1:
        return []
    rows = []
    for row in client.jobs.rollouts(job.id, step=job.step, split="train"):
        rows.append(row)
        if len(rows) >= MAX_SAMPLE_ROWS:
            break
    return rows


def write_report(job_id: str, out: str, url: str | None, api_key: str | None) -> str:
    """The `grpo-service report` command: URL and key from the options, GRPO_URL /
    GRPO_API_KEY, or the `grpo login` profile. Returns the path written."""
    from pathlib import Path

    from grpo_client import config

    profile = config.resolve(url, api_key)
    if profile.api_key is None:
        raise ClientError("no API key: pass --api-key, set GRPO_API_KEY or run `grpo login`")
    with Client(profile.url, profile.api_key) as client:
        text = build_report(client, job_id)
    path = Path(out)
    path.write_text(text, encoding="utf-8")
    return str(path)
