"""The AST checks behind each rule. One pass over a module's calls; each check is small.

Precision over recall: a finding must be a real unbounded wait in the code as written.
Where the code shows the wait is bounded another way (the call is awaited inside
``asyncio.timeout``/``deadlines.scope``; the pending tasks are cancelled; the socket
gets ``settimeout``), nothing is reported.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from ._names import Names

_VERBS = ("get", "post", "put", "patch", "delete", "head", "options", "request")

#: Calls whose missing timeout means no limit at all, with the timeout's positional index.
_NEEDS_TIMEOUT: dict[str, int | None] = {
    **{f"requests.{verb}": None for verb in _VERBS},
    **{f"requests.api.{verb}": None for verb in _VERBS},
    **{f"requests.Session.{verb}": None for verb in _VERBS},
    "urllib.request.urlopen": 2,
    "http.client.HTTPConnection": 2,
    "http.client.HTTPSConnection": 4,
    "urllib3.PoolManager": None,
    "urllib3.HTTPConnectionPool": None,
    "urllib3.HTTPSConnectionPool": None,
    "urllib3.connection_from_url": None,
    "urllib3.request": None,
}
#: Calls whose missing timeout means a long default (aiohttp: 5 minutes in total).
_LONG_DEFAULT: dict[str, str] = {
    "aiohttp.ClientSession": "aiohttp's default is 300 s in total, far past any request's deadline",
    "aiohttp.client.ClientSession": "aiohttp's default is 300 s in total",
    "aiohttp.request": "aiohttp's default is 300 s in total",
}
#: Calls where an explicit ``timeout=None`` disables the limit.
_NONE_DISABLES = (
    set(_NEEDS_TIMEOUT)
    | set(_LONG_DEFAULT)
    | {f"httpx.{verb}" for verb in (*_VERBS, "stream")}
    | {f"httpx.{kind}.{verb}" for kind in ("Client", "AsyncClient") for verb in (*_VERBS, "stream")}
    | {"httpx.Client", "httpx.AsyncClient"}
    | {f"aiohttp.ClientSession.{verb}" for verb in (*_VERBS, "ws_connect")}
    | {f"urllib3.PoolManager.{verb}" for verb in ("request", "urlopen")}
)
#: Context managers whose body is cancelled at a limit (an awaited call inside is bounded).
_CANCELLING_SCOPES = {
    "asyncio.timeout",
    "asyncio.timeout_at",
    "async_timeout.timeout",
    "deadlines.scope",
    "anyio.fail_after",
    "anyio.move_on_after",
    "trio.fail_after",
    "trio.move_on_after",
    "trio.fail_at",
    "trio.move_on_at",
}
#: trio's and anyio's scopes are plain `with` blocks, and cancel the awaits inside.
_SYNC_CANCELLING_SCOPES = {
    name for name in _CANCELLING_SCOPES if name.startswith(("anyio.", "trio."))
}
_THREAD_WORK = {"asyncio.to_thread", "anyio.to_thread.run_sync", "trio.to_thread.run_sync"}
#: httpx limits each phase (connect, each read, each write, the pool), never a whole call.
_HTTPX_FUNCTIONS = {f"httpx.{verb}" for verb in (*_VERBS, "stream")}
_HTTPX_CLIENTS = {"httpx.Client", "httpx.AsyncClient"}
_HTTPX_CALLS = (*_VERBS, "stream", "send")
#: Transports that never touch the network: a client on one of them waits for nothing.
_OFFLINE_TRANSPORTS = {"httpx.MockTransport", "httpx.ASGITransport", "httpx.WSGITransport"}
_GUARDS = {"deadlines.check", "deadlines.remaining", "time.monotonic", "time.perf_counter"}


@dataclass(frozen=True, slots=True)
class Raw:
    """A finding before suppression: the node it is about, the code and the message."""

    node: ast.AST
    code: str
    message: str


def _keyword(call: ast.Call, name: str) -> ast.keyword | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword
    return None


def _has_kwargs(call: ast.Call) -> bool:
    return any(keyword.arg is None for keyword in call.keywords)


def _argument(call: ast.Call, name: str, position: int | None) -> ast.expr | None:
    found = _keyword(call, name)
    if found is not None:
        return found.value
    if position is not None and len(call.args) > position:
        return call.args[position]
    return None


def _is_none(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _is_false(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _mentions(node: ast.AST | None, text: str) -> bool:
    """Whether a string constant or dict key under `node` contains `text`."""
    if node is None:
        return False
    return any(
        isinstance(sub, ast.Constant) and isinstance(sub.value, str) and text in sub.value
        for sub in ast.walk(node)
    )


class Checker:
    """Runs every check over one parsed module and collects `Raw` findings."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.names = Names(tree)
        self.found: list[Raw] = []
        self._checks: tuple[Callable[[ast.Call, str], None], ...] = (
            self._http,
            self._stream,
            self._thread_futures,
            self._asyncio_wait,
            self._cannot_cancel,
            self._pools,
            self._sockets,
            self._per_read_only,
        )

    def run(self) -> list[Raw]:
        """All findings of the module, in source order."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call):
                name = self.names.call_name(node) or ""
                for check in self._checks:
                    check(node, name)
            elif isinstance(node, ast.AsyncWith | ast.With):
                self._scope_around_thread(node)
        return sorted(self.found, key=lambda raw: (raw.node.lineno, raw.node.col_offset))  # type: ignore[attr-defined]

    def _report(self, node: ast.AST, code: str, message: str) -> None:
        self.found.append(Raw(node, code, message))

    # DLN101: HTTP without a timeout.

    def _bounded_by_scope(self, call: ast.Call) -> bool:
        """An awaited call inside a cancelling scope or wait_for is bounded by cancellation."""
        parent = self.names.parents.get(call)
        if isinstance(parent, ast.Call) and self.names.qualname(parent.func) == "asyncio.wait_for":
            return True
        awaited = isinstance(parent, ast.Await) or (
            isinstance(parent, ast.withitem)
            and isinstance(self.names.parents.get(parent), ast.AsyncWith)
        )
        if not awaited:
            return False
        for ancestor in self.names.ancestors(call):
            if isinstance(ancestor, ast.AsyncWith | ast.With) and self._cancelling(ancestor):
                return True
            if isinstance(ancestor, ast.Call) and self.names.qualname(ancestor.func) in (
                "asyncio.wait_for",
            ):
                return True
            if isinstance(ancestor, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                return False
        return False

    def _http(self, call: ast.Call, name: str) -> None:
        timeout_kw = _keyword(call, "timeout")
        if name in _NONE_DISABLES and timeout_kw is not None and _is_none(timeout_kw.value):
            if not self._bounded_by_scope(call):
                self._report(
                    call, "DLN101", f"{name}(timeout=None) disables the limit: it can wait forever"
                )
            return
        if name in _NEEDS_TIMEOUT:
            if _argument(call, "timeout", _NEEDS_TIMEOUT[name]) is None and not _has_kwargs(call):
                fix = "timeout=(connect, read)" if name.startswith("requests.") else "timeout="
                self._report(
                    call, "DLN101", f"{name}() without a timeout can wait forever: pass {fix}"
                )
        elif name in _LONG_DEFAULT:
            if _keyword(call, "timeout") is None and not _has_kwargs(call):
                self._report(
                    call,
                    "DLN101",
                    f"{name}() without a timeout: {_LONG_DEFAULT[name]}; pass"
                    " timeout=aiohttp.ClientTimeout(total=..., connect=...)",
                )
        elif name == "httpx.Timeout":
            self._httpx_timeout(call)
        elif name in ("aiohttp.ClientTimeout", "aiohttp.client.ClientTimeout"):
            total = _argument(call, "total", 0)
            if (total is None or _is_none(total)) and not _has_kwargs(call):
                said = "total=None" if _is_none(total) else "no total"
                self._report(
                    call,
                    "DLN101",
                    f"aiohttp.ClientTimeout with {said}: sock_read limits each gap, so a"
                    " server that trickles bytes is never stopped; set total=",
                )

    def _httpx_timeout(self, call: ast.Call) -> None:
        default = _argument(call, "timeout", 0)
        disabled = []
        for phase in ("connect", "read", "write", "pool"):
            value = _keyword(call, phase)
            if (value is not None and _is_none(value.value)) or (
                value is None and _is_none(default)
            ):
                disabled.append(phase)
        if disabled:
            self._report(
                call,
                "DLN101",
                f"httpx.Timeout with no {'/'.join(disabled)} limit: that phase can wait forever",
            )

    # DLN109: per-phase limits only, nothing on the whole call.

    def _per_read_only(self, call: ast.Call, name: str) -> None:
        if name not in _HTTPX_FUNCTIONS and name not in _HTTPX_CLIENTS:
            return
        timeout = _argument(call, "timeout", None)
        if _is_none(timeout) or self._timeout_disabled(timeout):
            return  # DLN101 says it: no limit at all
        if name in _HTTPX_CLIENTS and (
            self._offline(call) or self._unused(call) or self._calls_bounded(name)
        ):
            return
        if timeout is not None:
            limits = "the timeout given"
        elif _has_kwargs(call):
            limits = "the timeout it is passed, if any"
        else:
            limits = "httpx's default: 5 s each"
        self._report(
            call,
            "DLN109",
            f"{name}() limits each phase ({limits}), never the whole call: each read restarts"
            " the clock, so a server that trickles bytes holds it forever; bound the call"
            " (asyncio.timeout, anyio.fail_after) or use deadlines.httpx, which has a total",
        )

    def _timeout_disabled(self, timeout: ast.expr | None) -> bool:
        """`httpx.Timeout(None)`: DLN101's finding (no limit), not this one."""
        return (
            isinstance(timeout, ast.Call)
            and self.names.qualname(timeout.func) == "httpx.Timeout"
            and _is_none(_argument(timeout, "timeout", 0))
        )

    def _offline(self, call: ast.Call) -> bool:
        transport = _argument(call, "transport", None)
        if isinstance(transport, ast.Call):
            return self.names.qualname(transport.func) in _OFFLINE_TRANSPORTS
        return _keyword(call, "app") is not None

    def _unused(self, call: ast.Call) -> bool:
        """`with httpx.Client() as client:` whose body never uses `client`: no request."""
        item = self.names.parents.get(call)
        block = self.names.parents.get(item) if isinstance(item, ast.withitem) else None
        if not isinstance(item, ast.withitem) or not isinstance(block, ast.With | ast.AsyncWith):
            return False
        target = item.optional_vars
        if not isinstance(target, ast.Name):
            return False
        return not any(
            isinstance(node, ast.Name) and node.id == target.id
            for statement in block.body
            for node in ast.walk(statement)
        )

    def _calls_bounded(self, client: str) -> bool:
        """Every request this module makes with such a client is awaited under a scope."""
        calls = [
            node
            for node in ast.walk(self.tree)
            if isinstance(node, ast.Call)
            and (self.names.call_name(node) or "") in {f"{client}.{verb}" for verb in _HTTPX_CALLS}
        ]
        return bool(calls) and all(self._bounded_by_scope(node) for node in calls)

    # DLN102: streamed bodies.

    def _stream(self, call: ast.Call, name: str) -> None:
        if name.startswith("requests.") and _is_true(_argument(call, "stream", None)):
            what = "requests' timeout"
        elif name.startswith("urllib3.") and _is_false(_argument(call, "preload_content", None)):
            what = "urllib3's timeout"
        else:
            return
        if self._stream_guarded(call):
            return
        self._report(
            call,
            "DLN102",
            f"{what} limits the connect and each read, not the whole body: a server that"
            " trickles keeps this stream open forever; check a deadline while reading"
            " (deadlines.check() in the loop)",
        )

    def _stream_guarded(self, call: ast.Call) -> bool:
        """Every loop over the body in this function checks the time: bounded."""
        scope = self.names.scope_of(call)
        loops = [
            node
            for node in ast.walk(scope)
            if isinstance(node, ast.For | ast.AsyncFor)
            and isinstance(node.iter, ast.Call)
            and isinstance(node.iter.func, ast.Attribute)
            and node.iter.func.attr in ("iter_content", "iter_lines", "stream", "read_chunked")
        ]
        return bool(loops) and all(self._has_guard(loop) for loop in loops)

    def _has_guard(self, loop: ast.For | ast.AsyncFor) -> bool:
        for node in ast.walk(loop):
            if isinstance(node, ast.Call):
                name = self.names.qualname(node.func) or ""
                attr = node.func.attr if isinstance(node.func, ast.Attribute) else ""
                if name in _GUARDS or attr in ("check", "remaining", "expired", "time"):
                    return True
            if isinstance(node, ast.Name | ast.Attribute):
                label = node.id if isinstance(node, ast.Name) else node.attr
                if "deadline" in label.lower():
                    return True
        return False

    # DLN103: concurrent.futures.

    def _thread_futures(self, call: ast.Call, name: str) -> None:
        if name in ("concurrent.futures.wait", "concurrent.futures.as_completed"):
            timeout = _argument(call, "timeout", 1)
            if timeout is not None and not _is_none(timeout):
                self._report(
                    call,
                    "DLN103",
                    f"{name}(timeout=...) stops waiting, but the threads keep running the work"
                    " (a running future cannot be cancelled): bound the work itself",
                )
            return
        if not (isinstance(call.func, ast.Attribute) and call.func.attr == "result"):
            return
        timeout = _argument(call, "timeout", 0)
        if timeout is None or _is_none(timeout):
            return
        receiver = call.func.value
        kind = self.names.type_of(receiver)
        if kind == "asyncio.ConcurrentFuture":
            if self._cancels(receiver, call):
                return
            self._report(
                call,
                "DLN103",
                "result(timeout=...) on run_coroutine_threadsafe() stops waiting but the"
                " coroutine keeps running: call .cancel() on the future when it times out",
            )
            return
        if kind is not None:
            return
        self._report(
            call,
            "DLN103",
            "future.result(timeout=...) stops the waiter, not the worker: the thread keeps"
            " running the work (Future.cancel() cannot stop a running call); pass the"
            " deadline into the work so it stops itself",
        )

    def _cancels(self, receiver: ast.expr, near: ast.AST) -> bool:
        if not isinstance(receiver, ast.Name):
            return False
        for node in ast.walk(self.names.scope_of(near)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "cancel"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == receiver.id
            ):
                return True
        return False

    # DLN104: asyncio.wait leaves the pending tasks running.

    def _asyncio_wait(self, call: ast.Call, name: str) -> None:
        if name != "asyncio.wait":
            return
        timeout = _keyword(call, "timeout")
        when = _keyword(call, "return_when")
        early = when is not None and not (
            isinstance(when.value, ast.Attribute | ast.Name)
            and (self.names.qualname(when.value) or "").endswith("ALL_COMPLETED")
        )
        if not early and (timeout is None or _is_none(timeout.value)):
            return
        if self._wait_handled(call, self._pending_name(call)):
            return
        why = "at the timeout" if timeout is not None and not _is_none(timeout.value) else "early"
        self._report(
            call,
            "DLN104",
            f"asyncio.wait() returns {why} without cancelling the pending tasks: they keep"
            " running for nobody; cancel them (for t in pending: t.cancel())",
        )

    def _pending_name(self, call: ast.Call) -> str | None:
        parent = self.names.parents.get(call)
        if isinstance(parent, ast.Await):
            parent = self.names.parents.get(parent)
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
            target = parent.targets[0]
            if isinstance(target, ast.Tuple) and len(target.elts) == 2:
                second = target.elts[1]
                if isinstance(second, ast.Name) and second.id != "_":
                    return second.id
        return None

    def _awaited_names(self, call: ast.Call, scope: ast.AST) -> set[str]:
        """Names that hold the waited-for tasks: the argument, its elements, its sources."""
        if not call.args:
            return set()
        first = call.args[0]
        names = {n.id for n in ast.walk(first) if isinstance(n, ast.Name)}
        if isinstance(first, ast.Name):  # built from another collection: `[t for t in tasks]`
            for node in ast.walk(scope):
                if (
                    isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == first.id for t in node.targets)
                    and isinstance(node.value, ast.ListComp | ast.SetComp | ast.GeneratorExp)
                ):
                    for generator in node.value.generators:
                        names |= {n.id for n in ast.walk(generator.iter) if isinstance(n, ast.Name)}
        return names

    def _wait_handled(self, call: ast.Call, pending: str | None) -> bool:
        """The tasks left pending are cancelled, waited for again, or handed on.

        Accepted: ``t.cancel()`` on a waited task or on the loop variable over them; a
        call that passes them to a ``...cancel...`` function or to a function of this
        module that cancels; ``pending`` waited for again, returned or stored.
        """
        scope = self.names.scope_of(call)
        names = self._awaited_names(call, scope)
        if pending is not None and pending in names:
            return True  # `done, pending = await asyncio.wait(pending, ...)`: waited next round
        if pending is not None:
            names.add(pending)
        for node in ast.walk(scope):
            if node is call:
                continue
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                receiver = node.func.value
                if (
                    node.func.attr == "cancel"
                    and isinstance(receiver, ast.Name)
                    and receiver.id in names
                ):
                    return True
            if isinstance(node, ast.For | ast.comprehension) and any(
                _names_in(node.iter, name) for name in names
            ):
                body: list[ast.AST] = list(node.body) if isinstance(node, ast.For) else []
                if isinstance(node, ast.comprehension):
                    parent = self.names.parents.get(node)
                    body = [parent] if parent is not None else []
                if any(_calls_attr(part, "cancel") for part in body):
                    return True
            if isinstance(node, ast.Call) and any(
                _names_in(arg, name) for arg in node.args for name in names
            ):
                if self._cancelling_callee(node):
                    return True
                label = self.names.qualname(node.func) or ""
                if (
                    label == "asyncio.wait"
                    and pending is not None
                    and any(_names_in(arg, pending) for arg in node.args)
                ):
                    return True
            if pending is not None:
                if isinstance(node, ast.Return | ast.Yield) and _names_in(node.value, pending):
                    return True
                if (
                    isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Attribute) for t in node.targets)
                    and _names_in(node.value, pending)
                ):
                    return True
        return False

    def _cancelling_callee(self, call: ast.Call) -> bool:
        func = call.func
        label = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if "cancel" in label.lower():
            return True
        if isinstance(func, ast.Name):
            for node in self.tree.body:
                if (
                    isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                    and node.name == func.id
                    and _calls_attr(node, "cancel")
                ):
                    return True
        return False

    # DLN105: a timeout around work it cannot stop.

    def _cannot_cancel(self, call: ast.Call, name: str) -> None:
        if name != "asyncio.wait_for" or not call.args:
            return
        inner = call.args[0]
        why = self._uncancellable(inner)
        if why is not None:
            self._report(
                call,
                "DLN105",
                f"asyncio.wait_for() cancels the await, but {why}: the work keeps running"
                " after the timeout",
            )

    def _uncancellable(self, node: ast.AST) -> str | None:
        if not isinstance(node, ast.Call):
            return None
        name = self.names.qualname(node.func) or ""
        if name == "asyncio.shield":
            return "asyncio.shield() protects the inner task from that cancellation"
        if name in _THREAD_WORK or (
            isinstance(node.func, ast.Attribute) and node.func.attr == "run_in_executor"
        ):
            return "a thread cannot be cancelled"
        return None

    def _cancelling(self, node: ast.AsyncWith | ast.With) -> bool:
        """Whether the block is a cancel scope: its awaits are cancelled at the limit."""
        names = _CANCELLING_SCOPES if isinstance(node, ast.AsyncWith) else _SYNC_CANCELLING_SCOPES
        return any(
            isinstance(item.context_expr, ast.Call)
            and self.names.qualname(item.context_expr.func) in names
            for item in node.items
        )

    def _scope_around_thread(self, node: ast.AsyncWith | ast.With) -> None:
        if not self._cancelling(node):
            return
        for statement in node.body:
            for sub in ast.walk(statement):
                if isinstance(sub, ast.Await) and isinstance(sub.value, ast.Call):
                    why = self._uncancellable(sub.value)
                    if why is not None:
                        self._report(
                            sub.value,
                            "DLN105",
                            f"the timeout scope cancels this await, but {why}: the work keeps"
                            " running after the deadline unless it checks the deadline itself",
                        )

    # DLN106 / DLN107: database pools.

    def _pools(self, call: ast.Call, name: str) -> None:
        if _has_kwargs(call):
            return
        if name in ("asyncpg.create_pool", "asyncpg.connect", "asyncpg.pool.create_pool"):
            settings = _keyword(call, "server_settings")
            if _keyword(call, "command_timeout") is None and not _mentions(
                settings.value if settings else None, "statement_timeout"
            ):
                self._report(
                    call,
                    "DLN107",
                    f"{name}() without command_timeout: a statement can run forever; set"
                    " command_timeout= (or server_settings statement_timeout)",
                )
        elif name.startswith("psycopg_pool.") and name.rsplit(".", 1)[1] in (
            "ConnectionPool",
            "AsyncConnectionPool",
            "NullConnectionPool",
            "AsyncNullConnectionPool",
        ):
            if _keyword(call, "timeout") is None:
                self._report(
                    call,
                    "DLN106",
                    f"{name}() without timeout: getting a connection waits 30 s by default,"
                    " longer than any request's deadline; set timeout=",
                )
        elif name.endswith("asyncpg.Pool.acquire"):
            if _argument(call, "timeout", None) is None:
                self._report(
                    call,
                    "DLN106",
                    "pool.acquire() without timeout waits forever for a connection when the"
                    " pool is full; pass timeout=",
                )
        elif name in ("sqlalchemy.create_engine", "sqlalchemy.ext.asyncio.create_async_engine"):
            self._sqlalchemy(call, name)

    def _sqlalchemy(self, call: ast.Call, name: str) -> None:
        url = _argument(call, "url", 0)
        if (
            isinstance(url, ast.Constant)
            and isinstance(url.value, str)
            and url.value.startswith("sqlite")
        ):
            return  # no server, no pool to wait on
        poolclass = _keyword(call, "poolclass")
        pooled = poolclass is None or not (
            (self.names.qualname(poolclass.value) or "").endswith(("NullPool", "StaticPool"))
        )
        if pooled and _keyword(call, "pool_timeout") is None:
            self._report(
                call,
                "DLN106",
                f"{name}() without pool_timeout: a checkout waits 30 s by default when the"
                " pool is full; set pool_timeout=",
            )
        connect_args = _keyword(call, "connect_args")
        if connect_args is not None and not isinstance(connect_args.value, ast.Dict):
            return  # built elsewhere: cannot tell
        has_limit = _mentions(url, "statement_timeout") or (
            connect_args is not None
            and (
                _mentions(connect_args.value, "statement_timeout")
                or _mentions(connect_args.value, "command_timeout")
            )
        )
        if not has_limit:
            self._report(
                call,
                "DLN107",
                f"{name}() without a statement limit: set connect_args (options"
                " '-c statement_timeout=...', or asyncpg's command_timeout)",
            )

    # DLN108: sockets.

    def _sockets(self, call: ast.Call, name: str) -> None:
        if name == "socket.create_connection":
            timeout = _argument(call, "timeout", 1)
            missing = (timeout is None and not _has_kwargs(call)) or _is_none(timeout)
            if missing and not self._default_timeout_set():
                self._report(
                    call,
                    "DLN108",
                    "socket.create_connection() without a timeout: connect waits for the"
                    " OS (about 2 minutes on Linux) and reads block forever",
                )
        elif name == "socket.socket":
            self._socket_object(call)
        elif name == "socket.socket.settimeout" and call.args and _is_none(call.args[0]):
            self._report(
                call, "DLN108", "settimeout(None) makes every wait on this socket unbounded"
            )

    def _default_timeout_set(self) -> bool:
        for node in ast.walk(self.tree):
            if (
                isinstance(node, ast.Call)
                and self.names.qualname(node.func) == "socket.setdefaulttimeout"
                and node.args
                and not _is_none(node.args[0])
            ):
                return True
        return False

    def _socket_object(self, call: ast.Call) -> None:
        parent = self.names.parents.get(call)
        variable: str | None = None
        if isinstance(parent, ast.Assign) and isinstance(parent.targets[0], ast.Name):
            variable = parent.targets[0].id
        elif isinstance(parent, ast.withitem) and isinstance(parent.optional_vars, ast.Name):
            variable = parent.optional_vars.id
        if variable is None or self._default_timeout_set():
            return
        for node in ast.walk(self.names.scope_of(call)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == variable
            ):
                method = node.func.attr
                if method == "settimeout" and node.args and not _is_none(node.args[0]):
                    return
                if method == "setblocking" and node.args and _is_false(node.args[0]):
                    return  # non-blocking: the event loop or select() does the waiting
                if method in ("listen", "bind"):
                    return  # a server socket: waiting for clients is its job
        self._report(
            call,
            "DLN108",
            f"socket {variable!r} has no timeout: connect, send and recv can block forever;"
            " call settimeout() (or setblocking(False) for an event loop)",
        )


def _names_in(node: ast.AST | None, name: str) -> bool:
    if node is None:
        return False
    return any(isinstance(sub, ast.Name) and sub.id == name for sub in ast.walk(node))


def _calls_attr(node: ast.AST, attr: str) -> bool:
    return any(
        isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == attr
        for sub in ast.walk(node)
    )
