"""The WSGI DeadlineMiddleware around a Flask app under waitress on loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from flask import Flask, Response, jsonify, request

import deadlines
import deadlines.wsgi
from deadlines.wsgi import DeadlineMiddleware, Limits

from .conftest import Events, serve_waitress

pytestmark = pytest.mark.realtime


def build(progress: dict[str, float]) -> Flask:
    """A Flask app whose handlers report their deadline and work in checked steps."""
    app = Flask(__name__)

    @app.get("/info")
    def info() -> Response:
        return jsonify(remaining=deadlines.remaining() if deadlines.current() else None)

    @app.get("/work")
    def work() -> Response:
        key = request.args["id"]
        for step in range(200):
            deadlines.check()  # sync code stops between steps, not in the middle of one
            progress[key] = step
            time.sleep(0.01)
        return jsonify(done=True)

    @app.get("/stream")
    def stream() -> Response:
        def chunks() -> Iterator[str]:
            yield f"{deadlines.remaining():.3f};"
            for _ in range(3):
                time.sleep(0.01)
                deadlines.check()
                yield "x;"

        return Response(chunks(), mimetype="text/plain")

    @app.get("/late-stream")
    def late_stream() -> Response:
        def chunks() -> Iterator[str]:
            yield "first;"
            time.sleep(0.4)
            deadlines.check()
            yield "never"

        return Response(chunks(), mimetype="text/plain")

    app.register_error_handler(deadlines.DeadlineExceeded, deadlines.wsgi.timeout_response)
    app.wsgi_app = DeadlineMiddleware(  # type: ignore[method-assign]
        app.wsgi_app,
        default=1.0,
        maximum=2.0,
        routes={"/bulk/*": Limits(default=3.0, maximum=4.0)},
    )
    return app


@pytest.fixture(scope="module")
def progress() -> dict[str, float]:
    """How far each /work request got."""
    return {}


@pytest.fixture(scope="module")
def url(progress: dict[str, float]) -> Iterator[str]:
    """The Flask app under waitress."""
    with serve_waitress(build(progress)) as base:
        yield base


def ms(value: str) -> dict[str, str]:
    """The deadline header."""
    return {"x-request-timeout-ms": value}


def test_handler_sees_budget(url: str) -> None:
    """Flask handlers see header, default and capped budgets through deadlines.remaining()."""
    assert 0.5 < httpx.get(f"{url}/info", headers=ms("800")).json()["remaining"] <= 0.75
    assert 0.8 < httpx.get(f"{url}/info").json()["remaining"] <= 0.95
    assert 1.8 < httpx.get(f"{url}/info", headers=ms("50000")).json()["remaining"] <= 1.95
    folded = {"x-request-timeout-ms": "900, 400"}  # a proxy folded two values into one
    assert 0.2 < httpx.get(f"{url}/info", headers=folded).json()["remaining"] <= 0.35


def test_check_stops_work_with_504(url: str, progress: dict[str, float], events: Events) -> None:
    """Work that calls deadlines.check() stops at the deadline and the client gets a 504."""
    begin = time.monotonic()
    response = httpx.get(f"{url}/work?id=a", headers=ms("300"), timeout=5)
    took = time.monotonic() - begin
    assert response.status_code == 504
    assert response.json()["limit"] == "x-request-timeout-ms"
    assert 0.24 <= took <= 0.25 + 0.5
    assert progress["a"] < 60  # stopped well before its 200 steps
    assert events.wait_finished(1)[0].outcome == "deadline"


def test_expired_on_arrival(url: str, progress: dict[str, float], events: Events) -> None:
    """A header of 0 is answered 504 without calling the app."""
    response = httpx.get(f"{url}/work?id=never", headers=ms("0"), timeout=5)
    assert response.status_code == 504
    assert "never" not in progress
    assert events.wait_finished(1)[0].outcome == "budget_exhausted"


def test_streamed_body_runs_under_deadline(url: str, events: Events) -> None:
    """A generator body runs under the request's deadline; a late one is cut off."""
    text = httpx.get(f"{url}/stream", headers=ms("700")).text
    assert 0.4 < float(text.split(";")[0]) <= 0.65
    assert text.endswith("x;x;x;")
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.get(f"{url}/late-stream", headers=ms("200"), timeout=5).read()
    outcomes = [e.outcome for e in events.wait_finished(2)]
    assert outcomes == ["ok", "deadline"]


def test_no_deadline_leaks_between_requests(url: str) -> None:
    """Worker threads carry no deadline from one request to the next."""
    assert deadlines.current() is None
    for value in ("100", "1500", "100"):
        left = httpx.get(f"{url}/info", headers=ms(value)).json()["remaining"]
        assert left <= int(value) / 1000


def test_app_must_be_callable() -> None:
    """A non-callable app is refused."""
    with pytest.raises(TypeError, match="WSGI"):
        DeadlineMiddleware(object(), default=1, maximum=2)  # type: ignore[arg-type]


def test_bare_wsgi_app_deadline_becomes_504(events: Events) -> None:
    """Without a framework, a DeadlineExceeded escaping the app becomes the JSON 504."""

    def app(environ: dict[str, object], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        while True:
            time.sleep(0.01)
            deadlines.check()

    wrapped = DeadlineMiddleware(app, default=0.2, maximum=1.0, reserve=0.0)
    with serve_waitress(wrapped) as base:
        begin = time.monotonic()
        response = httpx.get(f"{base}/x", timeout=5)
        assert response.status_code == 504
        assert 0.19 <= time.monotonic() - begin <= 0.2 + 0.5
        assert response.json()["limit"] == "route default"
    assert events.wait_finished(1)[0].outcome == "deadline"


def test_timeout_response_outside_middleware() -> None:
    """timeout_response works without the middleware, naming the error's own budget."""
    body, status, headers = deadlines.wsgi.timeout_response(
        deadlines.DeadlineExceeded(limit=0.5, elapsed=0.51)
    )
    assert status == 504
    assert b'"budget_ms":500' in body
    assert ("Content-Type", "application/json") in headers


def test_body_errors_report_the_requests_budget(events: Events) -> None:
    """A deadline error raised while the body iterates names the request's budget and
    the time since it arrived, not what was left when that step of the body began."""
    seen: list[deadlines.DeadlineExceeded] = []

    def body() -> Iterator[bytes]:
        time.sleep(0.3)  # 0.1 + 0.3 s: past the 0.25 s budget
        try:
            deadlines.check()
        except deadlines.DeadlineExceeded as exc:
            seen.append(exc)
            raise
        yield b"never"

    def app(environ: dict[str, object], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        time.sleep(0.1)  # the app takes a while before handing over its body
        return body()

    wrapped = DeadlineMiddleware(app, default=1.0, maximum=2.0)
    with serve_waitress(wrapped) as base:
        response = httpx.get(f"{base}/x", headers=ms("300"), timeout=5)
    assert response.status_code == 504
    assert response.json()["budget_ms"] == 250
    (error,) = seen
    assert error.limit == pytest.approx(0.25)
    assert error.elapsed is not None and error.elapsed >= 0.39
    assert events.wait_finished(1)[0].outcome == "deadline"


def test_head_takes_the_get_routes_limits(events: Events) -> None:
    """Flask answers HEAD with the GET view: a "GET /path" route's limits and label apply."""
    app = Flask(__name__)

    @app.get("/report")
    def report() -> Response:
        return Response(headers={"x-remaining": f"{deadlines.remaining():.3f}"})

    routes = {"GET /report": Limits(default=3.0, maximum=5.0)}
    app.wsgi_app = DeadlineMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, default=0.2, maximum=1.0, routes=routes
    )
    with serve_waitress(app) as base, httpx.Client(timeout=5) as client:
        for method in ("GET", "HEAD"):
            answer = client.request(method, f"{base}/report")
            assert answer.status_code == 200
            assert 2.5 < float(answer.headers["x-remaining"]) <= 2.95
    assert [e.route for e in events.wait_finished(2)] == ["GET /report", "GET /report"]


def test_sized_and_file_bodies_keep_their_length(tmp_path: Any, events: Events) -> None:
    """A list body keeps its length and a ``wsgi.file_wrapper`` body stays the server's:
    waitress sends Content-Length and keeps the connection open, as without the
    middleware (a plain iterator would make it close the connection after each answer)."""
    page = tmp_path / "page.txt"
    page.write_bytes(b"hello")

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        start_response("200 OK", [("Content-Type", "text/plain")])
        if environ["PATH_INFO"] == "/file":
            return environ["wsgi.file_wrapper"](page.open("rb"))
        return [b"hello"]

    wrapped = DeadlineMiddleware(app, default=1.0, maximum=2.0)
    with serve_waitress(wrapped) as base, httpx.Client(timeout=5) as client:
        for path in ("/list", "/list", "/file", "/file"):
            answer = client.get(f"{base}{path}")
            assert (answer.status_code, answer.text) == (200, "hello")
            assert answer.headers.get("content-length") == "5"
            assert answer.headers.get("connection") != "close"
    assert [e.outcome for e in events.wait_finished(4)] == ["ok"] * 4


def test_answers_of_5xx_are_errors(events: Events) -> None:
    """Flask turns an exception into a 500 itself: the middleware still counts an error.
    A 5xx the view returns is one too; a 4xx is an answer."""
    app = Flask(__name__)

    @app.get("/boom")
    def boom() -> Response:
        raise RuntimeError("boom")

    @app.get("/busy")
    def busy() -> tuple[str, int]:
        return "busy", 503

    app.wsgi_app = DeadlineMiddleware(app.wsgi_app, default=1.0, maximum=2.0)  # type: ignore[method-assign]
    with serve_waitress(app) as base, httpx.Client(timeout=5) as client:
        statuses = [client.get(f"{base}{path}").status_code for path in ("/boom", "/busy", "/x")]
    assert statuses == [500, 503, 404]
    assert [e.outcome for e in events.wait_finished(3)] == ["error", "error", "ok"]
