"""Request rate per API key: a token bucket of `rate_limit_burst` requests (default: the
per-minute figure), refilled at `rate_limit_per_minute` / 60 a second.

The buckets live in Redis when there is one (`redis_url`, else the broker's URL when it is
redis://), so every API process draws from the same bucket: one Lua script reads, refills and
takes a token atomically, on Redis's clock. Without Redis (embedded mode) each process keeps
its own buckets. Only accepted keys get a bucket (the limit is checked after authentication),
so invalid keys cannot fill the table; they are the failed-auth throttle's.

Redis unreachable: the request is let through without the headers (logged, at most once a
minute). The limit protects the service, it is not what a request's correctness rests on, and
a Redis outage must not turn every status poll into an error.

Headers, with the IETF draft's names: `RateLimit-Limit` (the per-minute figure),
`RateLimit-Remaining` (whole tokens left), `RateLimit-Reset` (seconds until the bucket is full
again); a 429 adds `Retry-After` (seconds until the next token).
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass

import anyio
import redis.asyncio as aioredis
from anyio.lowlevel import RunVar
from redis.exceptions import RedisError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.problems import too_many
from service.settings import Settings

log = logging.getLogger(__name__)

STATE_KEY = "grpo_ratelimit"  # where get_tenant leaves the headers for the middleware
REDIS_PREFIX = "grpo:ratelimit:"
REDIS_TIMEOUT_S = 0.5
MAX_LOCAL_BUCKETS = 100_000  # accepted keys only: never reached by a real deployment

# KEYS[1]: the bucket; ARGV: capacity, tokens per second. Returns {allowed, milli-tokens left}.
_TAKE = """
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or capacity
local at = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - at) * rate)
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((capacity - tokens) / rate * 1000) + 1000)
return {allowed, math.floor(tokens * 1000)}
"""


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    tokens: float  # left after this request
    capacity: int
    rate_per_s: float
    per_minute: int

    def headers(self) -> dict[str, str]:
        return {
            "RateLimit-Limit": str(self.per_minute),
            "RateLimit-Remaining": str(math.floor(self.tokens)),
            "RateLimit-Reset": str(math.ceil((self.capacity - self.tokens) / self.rate_per_s)),
        }

    @property
    def retry_after_s(self) -> int:
        return max(1, math.ceil((1 - self.tokens) / self.rate_per_s))


class LocalBuckets:
    """This process's buckets (embedded mode); on the event loop only, so no lock."""

    def __init__(self, max_buckets: int = MAX_LOCAL_BUCKETS) -> None:
        self.max_buckets = max_buckets
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    def take(self, key: str, capacity: int, rate_per_s: float) -> tuple[bool, float]:
        now = time.monotonic()
        tokens, at = self._buckets.pop(key, (float(capacity), now))
        tokens = min(capacity, tokens + (now - at) * rate_per_s)
        allowed = tokens >= 1
        if allowed:
            tokens -= 1
        self._buckets[key] = (tokens, now)  # most recently used last
        if len(self._buckets) > self.max_buckets:
            self._buckets.popitem(last=False)  # an evicted bucket comes back full: lenient
        return allowed, tokens


local_buckets = LocalBuckets()
_redis: RunVar[aioredis.Redis] = RunVar("grpo_ratelimit_redis")  # one client per event loop
_last_warning = 0.0


def redis_url_for(settings: Settings) -> str | None:
    """The Redis of the buckets: GRPO_REDIS_URL, else a redis:// broker, else none."""
    if settings.redis_url:
        return settings.redis_url
    broker = settings.broker_url or ""
    return broker if broker.startswith(("redis://", "rediss://")) else None


def _client(url: str) -> aioredis.Redis:
    try:
        return _redis.get()
    except LookupError:
        client = aioredis.Redis.from_url(
            url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        )
        _redis.set(client)
        return client


async def _take_redis(url: str, key: str, capacity: int, rate: float) -> tuple[bool, float]:
    client = _client(url)
    script = client.register_script(_TAKE)  # EVALSHA, loading the script once when missing
    allowed, milli = await script(keys=[REDIS_PREFIX + key], args=[capacity, rate])
    return bool(allowed), int(milli) / 1000


async def check(key_id: str, settings: Settings) -> dict[str, str] | None:
    """Take one token from the key's bucket: its RateLimit-* headers, None when the limit is
    off (or Redis unreachable), or a 429 ProblemError when the bucket is empty."""
    global _last_warning
    per_minute = settings.rate_limit_per_minute
    if per_minute <= 0:
        return None
    capacity = settings.rate_limit_burst or per_minute
    rate = per_minute / 60
    url = redis_url_for(settings)
    if url is None:
        allowed, tokens = local_buckets.take(key_id, capacity, rate)
    else:
        try:
            with anyio.fail_after(REDIS_TIMEOUT_S * 2):
                allowed, tokens = await _take_redis(url, key_id, capacity, rate)
        except (RedisError, OSError, TimeoutError) as exc:
            if time.monotonic() - _last_warning > 60:
                _last_warning = time.monotonic()
                log.warning("rate limit not applied: Redis unreachable (%s)", exc)
            return None
    decision = Decision(allowed, tokens, capacity, rate, per_minute)
    headers = decision.headers()
    if not allowed:
        problem = too_many(
            f"over this API key's rate limit of {per_minute} requests a minute",
            decision.retry_after_s,
        )
        problem.headers = {**(problem.headers or {}), **headers}
        raise problem
    return headers


class RateLimitHeaders:
    """Adds the RateLimit-* headers that `get_tenant` left in the request's state to the
    response, whatever the handler returned (a Response built by hand included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})  # the dict request.state writes to

        async def with_headers(message: Message) -> None:
            headers = state.get(STATE_KEY) if message["type"] == "http.response.start" else None
            if headers:
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [
                    (name.lower().encode(), value.encode())
                    for name, value in headers.items()
                    if name.lower().encode() not in present
                ]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, with_headers)
