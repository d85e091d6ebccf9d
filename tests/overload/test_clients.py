"""The overload guards in the httpx and aiohttp clients, against real loopback servers."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

import deadlines
import deadlines.aiohttp as daiohttp
import deadlines.httpx as dhttpx
from deadlines import (
    AdaptiveLimit,
    AttemptRefused,
    CallRefused,
    Dependency,
    Event,
    Hedge,
    HedgeSent,
    LimitChanged,
    Retry,
    RetryBudget,
    Throttle,
)
from deadlines.lab.servers import Connection, HealthyServer, SlowServer, response_head

pytestmark = pytest.mark.realtime

QUICK = Retry(attempts=3, backoff=0.001, jitter=False)


def refusals(events: list[Event]) -> list[str]:
    """The reasons of the `AttemptRefused` events seen."""
    return [e.reason for e in events if isinstance(e, AttemptRefused)]


class DelayServer(HealthyServer):
    """Answers the n-th request it receives after ``delays[n]`` seconds (then at once).

    The requests numbered in `drop` get no answer: their connection is closed instead.
    """

    def __init__(self, *delays: float, drop: frozenset[int] = frozenset()) -> None:
        super().__init__()
        self.delays = delays
        self.drop = drop
        self._lock = threading.Lock()
        self._count = 0

    def handle(self, conn: Connection) -> None:
        """Answer each request after its delay (or never, if the peer leaves first)."""
        while conn.read_request() is not None:
            with self._lock:
                number, self._count = self._count, self._count + 1
            delay = self.delays[number] if number < len(self.delays) else 0.0
            if (delay and not conn.wait(delay)) or number in self.drop:
                return
            if not conn.send(response_head(200, length=2) + b"ok"):
                return


# The retry budget.


def budgeted() -> Dependency:
    """Three attempts a call, but two retries in all over 10 s (the floor)."""
    budget = RetryBudget(percent=0.0, min_per_second=0.2, window=10)
    return Dependency("flaky", retry=QUICK, retry_budget=budget)


def test_httpx_retries_stay_within_the_budget(events: list[Event]) -> None:
    """Five calls to a 503 server: 5 first attempts + the 2 retries the budget allows."""
    with HealthyServer(status=503) as server, dhttpx.Client(budgeted()) as client:
        statuses = [client.get(server.url).status_code for _ in range(5)]
        assert statuses == [503] * 5
        assert server.wait_requests(7)
        time.sleep(0.1)  # an eighth attempt, if any, would have arrived by now
        assert len(server.requests) == 7
    assert refusals(events) == ["retry_budget"] * 4  # calls 2 (its 2nd retry) to 5


@pytest.mark.anyio
async def test_async_httpx_retries_stay_within_the_budget(events: list[Event]) -> None:
    """The async client follows the same budget."""
    with HealthyServer(status=503) as server:
        async with dhttpx.AsyncClient(budgeted()) as client:
            for _ in range(5):
                assert (await client.get(server.url)).status_code == 503
        assert len(server.requests) == 7
    assert refusals(events).count("retry_budget") == 4


@pytest.mark.anyio
async def test_aiohttp_retries_stay_within_the_budget(events: list[Event]) -> None:
    """aiohttp's middleware follows the same budget."""
    with HealthyServer(status=503) as server:
        async with daiohttp.session(budgeted()) as session:
            for _ in range(5):
                async with session.get(server.url) as response:
                    assert response.status == 503
        assert len(server.requests) == 7
    assert refusals(events).count("retry_budget") == 4


# Adaptive throttling.


def throttled() -> Dependency:
    """A throttle that refuses once the refusal probability reaches one half."""
    return Dependency("busy", throttle=Throttle(k=2.0, rand=lambda: 0.5))


def test_httpx_throttle_refuses_locally_as_the_server_refuses(events: list[Event]) -> None:
    """p = requests / (requests + 1) with no accepts: the third call is refused, unsent."""
    with HealthyServer(status=503) as server, dhttpx.Client(throttled()) as client:
        assert client.get(server.url).status_code == 503  # p = 0
        assert client.get(server.url).status_code == 503  # p = 1/2: not below 0.5
        start = time.monotonic()
        with pytest.raises(CallRefused) as caught:
            client.get(server.url)  # p = 2/3
        assert time.monotonic() - start < 0.1
        assert caught.value.reason == "throttled"
        assert len(server.requests) == 2
    assert refusals(events) == ["throttled"]


def test_httpx_throttle_never_refuses_a_healthy_server() -> None:
    """A server that answers 200 is never throttled."""
    with HealthyServer() as server, dhttpx.Client(throttled()) as client:
        for _ in range(20):
            assert client.get(server.url).status_code == 200
        assert len(server.requests) == 20


@pytest.mark.anyio
async def test_aiohttp_throttle_refuses_locally() -> None:
    """The aiohttp client is throttled the same way."""
    with HealthyServer(status=503) as server:
        async with daiohttp.session(throttled()) as session:
            for _ in range(2):
                async with session.get(server.url) as response:
                    assert response.status == 503
            with pytest.raises(CallRefused):
                await session.get(server.url)
        assert len(server.requests) == 2


# The adaptive concurrency limit.


@pytest.mark.anyio
async def test_async_httpx_refuses_calls_above_the_limit_at_once() -> None:
    """Limit 2, four calls at once to a slow server: two run, two are refused at once."""
    limit = AdaptiveLimit(initial=2, max_limit=2)
    refused: list[tuple[str, float]] = []
    answered: list[int] = []
    with SlowServer(0.3) as server:
        async with dhttpx.AsyncClient(Dependency("slow", limit=limit)) as client:

            async def one() -> None:
                start = time.monotonic()
                try:
                    answered.append((await client.get(server.url)).status_code)
                except CallRefused as exc:
                    refused.append((exc.reason, time.monotonic() - start))

            async with anyio.create_task_group() as group:
                for _ in range(4):
                    group.start_soon(one)
        assert answered == [200, 200]
        assert [reason for reason, _ in refused] == ["limit", "limit"]
        assert max(took for _, took in refused) < 0.2  # not queued behind the slow calls
        assert len(server.requests) == 2
    assert limit.in_flight == 0


def test_httpx_limit_comes_down_on_overload_answers(events: list[Event]) -> None:
    """Each 503 cuts the limit by 10 %, reported as LimitChanged."""
    limit = AdaptiveLimit(initial=10)
    with HealthyServer(status=503) as server, dhttpx.Client(Dependency("x", limit=limit)) as client:
        for _ in range(3):
            client.get(server.url)
    assert [e.limit for e in events if isinstance(e, LimitChanged)] == [9, 8, 7]
    assert limit.in_flight == 0


@pytest.mark.anyio
async def test_a_call_cut_by_the_deadline_cuts_the_limit_a_cancelled_one_does_not() -> None:
    """The deadline cutting a call is a sign of a slow dependency; a caller leaving is not."""
    limit = AdaptiveLimit(initial=10)
    with SlowServer(5.0) as server:
        async with dhttpx.AsyncClient(Dependency("slow", limit=limit)) as client:
            with pytest.raises(TimeoutError):
                async with deadlines.scope(0.1):
                    await client.get(server.url)
            assert (limit.limit, limit.in_flight) == (9, 0)
            with anyio.move_on_after(0.1):  # the caller gives up: a cancellation, no deadline
                await client.get(server.url)
            assert (limit.limit, limit.in_flight) == (9, 0)


@pytest.mark.anyio
async def test_aiohttp_limit_refuses_and_gives_places_back() -> None:
    """aiohttp: above the limit, refused; each place is given back as its response ends."""
    limit = AdaptiveLimit(initial=1, max_limit=1)
    with SlowServer(0.2) as server:
        async with daiohttp.session(Dependency("slow", limit=limit)) as session:
            async with session.get(server.url) as response:
                with pytest.raises(CallRefused):
                    await session.get(server.url)
                assert await response.read() == b"ok"
            async with session.get(server.url) as response:
                assert response.status == 200
    assert limit.in_flight == 0


class CapacityServer(HealthyServer):
    """Serves `workers` requests at a time, each taking `service` seconds; the rest queue."""

    def __init__(self, workers: int, service: float) -> None:
        super().__init__()
        self._workers = threading.Semaphore(workers)
        self.service = service

    def handle(self, conn: Connection) -> None:
        """Wait for a worker, work, answer; until the client closes the connection."""
        while conn.read_request() is not None:
            with self._workers:
                time.sleep(self.service)
            if not conn.send(response_head(200, length=2) + b"ok"):
                return


@pytest.mark.anyio
async def test_async_httpx_limit_finds_the_servers_capacity() -> None:
    """32 callers at a server that serves 4 at a time: the limit comes down from 32 toward
    the few calls that keep it busy, and the server keeps answering at its capacity."""
    limit = AdaptiveLimit(initial=32, max_limit=64)
    answered = 0
    with CapacityServer(4, 0.02) as server:  # capacity: 200 answers a second
        async with dhttpx.AsyncClient(Dependency("cap", pool_size=64, limit=limit)) as client:
            end = time.monotonic() + 2.0

            async def caller() -> None:
                nonlocal answered
                while time.monotonic() < end:
                    try:
                        await client.get(server.url)
                        answered += 1
                    except CallRefused:
                        await anyio.sleep(0.005)

            async with anyio.create_task_group() as group:
                for _ in range(32):
                    group.start_soon(caller)
    assert limit.limit <= 16
    assert answered >= 200  # at least half the capacity over the 2 s
    assert limit.in_flight == 0


# Hedged requests.


def hedged() -> Dependency:
    """Hedges after the p95 of what it has seen, as soon as it has seen one call."""
    return Dependency("tail", hedge=Hedge(min_samples=1, percent=1.0))


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_async_httpx_hedges_a_slow_get_and_cancels_the_loser(
    events: list[Event], anyio_backend: str
) -> None:
    """The slow first answer is raced by a backup at the p95; the backup wins, the slow
    request's connection is closed."""
    with DelayServer(0, 5.0) as server:
        async with dhttpx.AsyncClient(hedged()) as client:
            assert (await client.get(server.url + "/fast")).status_code == 200  # learns ~ms
            start = time.monotonic()
            response = await client.get(server.url + "/slow")
            elapsed = time.monotonic() - start
        assert response.status_code == 200
        assert elapsed < 1.0
        assert [r.target for r in server.requests] == ["/fast", "/slow", "/slow"]
        assert server.wait_peer_closed(1)
    sent = [e for e in events if isinstance(e, HedgeSent)]
    assert len(sent) == 1
    assert sent[0].dependency == "tail"


@pytest.mark.anyio
async def test_async_httpx2_hedges_too() -> None:
    """deadlines.httpx2 runs the same modules over httpx2: the backup wins there too."""
    import deadlines.httpx2 as dhttpx2

    with DelayServer(0, 5.0) as server:
        async with dhttpx2.AsyncClient(hedged()) as client:
            await client.get(server.url + "/learn")
            start = time.monotonic()
            assert (await client.get(server.url + "/slow")).text == "ok"
            assert time.monotonic() - start < 1.0
        assert len(server.requests) == 3


@pytest.mark.anyio
async def test_async_httpx_never_hedges_a_post() -> None:
    """A POST without an Idempotency-Key is sent once, however slow."""
    with DelayServer(0, 0.5) as server:
        async with dhttpx.AsyncClient(hedged()) as client:
            await client.post(server.url + "/fast", content=b"x")
            assert (await client.post(server.url + "/slow", content=b"x")).status_code == 200
        assert len(server.requests) == 2


@pytest.mark.anyio
async def test_async_httpx_no_hedge_outside_the_cap() -> None:
    """percent=0 and no floor: no backup is ever sent; the slow call is simply waited for."""
    dependency = Dependency("tail", hedge=Hedge(min_samples=1, percent=0.0, min_per_second=0.0))
    with DelayServer(0, 0.5) as server:
        async with dhttpx.AsyncClient(dependency) as client:
            await client.get(server.url + "/fast")
            start = time.monotonic()
            assert (await client.get(server.url + "/slow")).status_code == 200
            assert time.monotonic() - start >= 0.45
        assert len(server.requests) == 2


@pytest.mark.anyio
async def test_aiohttp_hedges_a_slow_get_and_cancels_the_loser(events: list[Event]) -> None:
    """aiohttp: the backup wins, the slow request's connection is closed."""
    with DelayServer(0, 5.0) as server:
        async with daiohttp.session(hedged()) as session:
            async with session.get(server.url + "/fast") as response:
                assert await response.read() == b"ok"
            start = time.monotonic()
            async with session.get(server.url + "/slow") as response:
                assert await response.read() == b"ok"
            elapsed = time.monotonic() - start
        assert elapsed < 1.0
        assert [r.target for r in server.requests] == ["/fast", "/slow", "/slow"]
        assert server.wait_peer_closed(1)
    assert sum(isinstance(e, HedgeSent) for e in events) == 1


@pytest.mark.anyio
async def test_aiohttp_unhedged_slow_call_keeps_its_answer() -> None:
    """Outside the cap the slow call is waited for, and its answer is the caller's."""
    dependency = Dependency("tail", hedge=Hedge(min_samples=1, percent=0.0, min_per_second=0.0))
    with DelayServer(0, 0.3) as server:
        async with daiohttp.session(dependency) as session:
            async with session.get(server.url + "/fast") as response:
                await response.read()
            async with session.get(server.url + "/slow") as response:
                assert await response.read() == b"ok"
        assert len(server.requests) == 2


@pytest.mark.anyio
async def test_aiohttp_primary_that_answers_first_wins() -> None:
    """A backup goes out, then the primary answers first: its answer; the backup cancelled."""
    dependency = Dependency("tail", hedge=Hedge(min_samples=1, percent=1.0))
    with DelayServer(0, 0.3, 5.0) as server:
        async with daiohttp.session(dependency) as session:
            async with session.get(server.url + "/learn") as response:
                await response.read()
            start = time.monotonic()
            async with session.get(server.url + "/slow") as response:
                assert await response.read() == b"ok"
            assert time.monotonic() - start < 2.0
        assert len(server.requests) == 3
        assert server.wait_peer_closed(1)


@pytest.mark.anyio
async def test_async_httpx_primary_that_answers_first_wins() -> None:
    """The same with httpx: the primary's answer, the backup cancelled."""
    dependency = Dependency("tail", hedge=Hedge(min_samples=1, percent=1.0))
    with DelayServer(0, 0.3, 5.0) as server:
        async with dhttpx.AsyncClient(dependency) as client:
            await client.get(server.url + "/learn")
            start = time.monotonic()
            assert (await client.get(server.url + "/slow")).text == "ok"
            assert time.monotonic() - start < 2.0
        assert len(server.requests) == 3
        assert server.wait_peer_closed(1)


@pytest.mark.anyio
async def test_async_httpx_primary_failing_after_the_backup_left_waits_for_it() -> None:
    """The primary fails while the backup runs: the backup's answer, not the error."""
    dependency = Dependency("tail", hedge=Hedge(min_samples=1, percent=1.0))
    with DelayServer(0, 0.2, 0.4, drop=frozenset({1})) as server:
        async with dhttpx.AsyncClient(dependency) as client:
            await client.get(server.url + "/learn")
            assert (await client.get(server.url + "/slow")).text == "ok"
        assert len(server.requests) == 3


@pytest.mark.anyio
async def test_aiohttp_primary_failing_after_the_backup_left_waits_for_it() -> None:
    """aiohttp: the same."""
    dependency = Dependency("tail", hedge=Hedge(min_samples=1, percent=1.0))
    with DelayServer(0, 0.2, 0.4, drop=frozenset({1})) as server:
        async with daiohttp.session(dependency) as session:
            async with session.get(server.url + "/learn") as response:
                await response.read()
            async with session.get(server.url + "/slow") as response:
                assert await response.read() == b"ok"
        assert len(server.requests) == 3


@pytest.mark.anyio
async def test_hedged_call_within_a_deadline_still_ends_at_the_deadline() -> None:
    """Both attempts are under the request's deadline: a hedge never extends it."""
    dependency = Dependency("tail", hedge=Hedge(min_samples=1, percent=1.0))
    with SlowServer(0.01) as fast:
        async with dhttpx.AsyncClient(dependency) as client:
            await client.get(fast.url)
    with SlowServer(5.0) as server:
        async with dhttpx.AsyncClient(dependency) as client:
            start = time.monotonic()
            with pytest.raises(TimeoutError):
                async with deadlines.scope(0.3):
                    await client.get(server.url)
            assert time.monotonic() - start < 0.8
        assert server.wait_requests(2)
        assert server.wait_peer_closed(2)


@pytest.mark.anyio
async def test_aiohttp_twin_request_has_its_own_headers() -> None:
    """The backup is a request of its own: same method, URL and body; its own headers."""
    import aiohttp

    from deadlines.aiohttp._aiohttp import twin_request

    seen: list[tuple[aiohttp.ClientRequest, aiohttp.ClientRequest]] = []

    async def capture(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        seen.append((request, twin_request(request)))
        return await handler(request)

    with HealthyServer() as server:
        async with (
            aiohttp.ClientSession(middlewares=(capture,)) as session,
            session.put(server.url, data=b"body") as response,
        ):
            assert response.status == 200
    ((request, twin),) = seen
    assert (twin.method, twin.url, twin.body) == (request.method, request.url, request.body)
    twin.headers["x-mine"] = "1"
    assert "x-mine" not in request.headers
    assert getattr(twin, "_upload_tracker", None) is None


@pytest.mark.parametrize(
    ("budget", "sent"),
    [(None, 300), (RetryBudget(percent=0.2, min_per_second=0.0), 120)],
    ids=["no budget", "20 % budget"],
)
def test_a_retry_storm_is_capped_by_the_budget(budget: RetryBudget | None, sent: int) -> None:
    """100 calls to a dependency down for everybody, 3 attempts each: 3x the load without
    a budget, 1.2x with a 20 % budget."""
    dependency = Dependency("down", retry=QUICK, retry_budget=budget)
    with HealthyServer(status=503) as server, dhttpx.Client(dependency) as client:
        for _ in range(100):
            assert client.get(server.url).status_code == 503
        assert len(server.requests) == sent
