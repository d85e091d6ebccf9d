"""What a name in a module refers to: imports with their aliases, and known object types.

``import requests as rq`` makes ``rq.get`` resolve to ``requests.get``;
``s = requests.Session()`` makes ``s.get`` resolve to ``requests.Session.get``. The
tracking is per function (then enclosing functions, then the module) and per class for
``self.attr``: enough for code as people write it, never a type checker.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

#: Calls that make an object whose methods the rules know, by the type they make.
CONSTRUCTORS: dict[str, str] = {
    "requests.Session": "requests.Session",
    "requests.session": "requests.Session",
    "requests.sessions.Session": "requests.Session",
    "httpx.Client": "httpx.Client",
    "httpx.AsyncClient": "httpx.AsyncClient",
    "aiohttp.ClientSession": "aiohttp.ClientSession",
    "aiohttp.client.ClientSession": "aiohttp.ClientSession",
    "urllib3.PoolManager": "urllib3.PoolManager",
    "urllib3.HTTPConnectionPool": "urllib3.PoolManager",
    "urllib3.HTTPSConnectionPool": "urllib3.PoolManager",
    "urllib3.connection_from_url": "urllib3.PoolManager",
    "socket.socket": "socket.socket",
    "socket.create_connection": "socket.socket",
    "asyncpg.create_pool": "asyncpg.Pool",
    "asyncio.run_coroutine_threadsafe": "asyncio.ConcurrentFuture",
}

FunctionLike = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


def _imports(tree: ast.AST) -> dict[str, str]:
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    names[head] = head
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


class Names:
    """Resolves expressions of one module to dotted names (``requests.Session.get``)."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.imports = _imports(tree)
        self.parents: dict[ast.AST, ast.AST] = {}
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent
        self._types: dict[ast.AST, dict[str, str]] = {}

    # Structure.

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        """The node's parents, innermost first."""
        while node in self.parents:
            node = self.parents[node]
            yield node

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The innermost function (or the module) that contains `node`."""
        for parent in self.ancestors(node):
            if isinstance(parent, FunctionLike):
                return parent
        return self.tree

    def class_of(self, node: ast.AST) -> ast.ClassDef | None:
        """The class whose method contains `node`, if any."""
        for parent in self.ancestors(node):
            if isinstance(parent, ast.ClassDef):
                return parent
        return None

    # Names.

    def qualname(self, node: ast.AST) -> str | None:
        """``requests.get`` for ``rq.get`` after ``import requests as rq``; None if unknown."""
        if isinstance(node, ast.Name):
            found = self.imports.get(node.id)
            return found if found is not None else self.type_of(node)
        if isinstance(node, ast.Attribute):
            base = self.qualname(node.value)
            if base is None:
                base = self.type_of(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    def call_name(self, call: ast.Call) -> str | None:
        """The dotted name of what `call` calls, through aliases and known objects."""
        if isinstance(call.func, ast.Attribute):
            owner = self.type_of(call.func.value)
            if owner is not None:
                return f"{owner}.{call.func.attr}"
        return self.qualname(call.func)

    def type_of(self, node: ast.AST) -> str | None:
        """The known type of an expression: a tracked variable, attribute or constructor call."""
        if isinstance(node, ast.Await):
            return self.type_of(node.value)
        if isinstance(node, ast.Call):
            name = self.qualname(node.func)
            return None if name is None else CONSTRUCTORS.get(name)
        if isinstance(node, ast.Name):
            scope: ast.AST | None = self.scope_of(node)
            while scope is not None:
                found = self._scope_types(scope).get(node.id)
                if found is not None:
                    return found or None
                scope = None if scope is self.tree else self.scope_of(scope)
            return None
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            owner = self.class_of(node)
            return None if owner is None else self._scope_types(owner).get(f"self.{node.attr}")
        return None

    def _annotation_type(self, annotation: ast.expr | None) -> str | None:
        if annotation is None:
            return None
        if isinstance(annotation, ast.BinOp):  # X | None
            return self._annotation_type(annotation.left) or self._annotation_type(annotation.right)
        if isinstance(annotation, ast.Subscript):  # Optional[X]
            return self._annotation_type(annotation.slice)
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                parsed = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return None
            return self._annotation_type(parsed)
        name = (
            self.qualname(annotation) if isinstance(annotation, ast.Name | ast.Attribute) else None
        )
        if name is None:
            return None
        known = set(CONSTRUCTORS.values())
        return name if name in known else None

    def _scope_types(self, scope: ast.AST) -> dict[str, str]:
        """Names bound in `scope` -> their known type, or "" when bound to something else.

        A name bound to anything in a function hides the same name outside it.
        """
        cached = self._types.get(scope)
        if cached is not None:
            return cached
        types: dict[str, str] = {}
        self._types[scope] = types
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            arguments = scope.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            for arg in [*every, arguments.vararg, arguments.kwarg]:
                if arg is not None:
                    types[arg.arg] = self._annotation_type(arg.annotation) or ""
        for node in _own_nodes(scope):
            targets: list[ast.expr] = []
            value: ast.AST | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign):
                targets, value = [node.target], node.value
                found = self._annotation_type(node.annotation)
                if found is not None:
                    self._record(types, node.target, found, scope)
                    continue
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                targets, value = [node.optional_vars], node.context_expr
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension | ast.AugAssign):
                targets = [node.target]
            found = "" if value is None else (self.type_of(value) or "")
            for target in targets:
                for name in _bound(target):
                    self._record(types, name, found if name is target else "", scope)
        return types

    def _record(self, types: dict[str, str], target: ast.AST, found: str, scope: ast.AST) -> None:
        if isinstance(target, ast.Name) and not isinstance(scope, ast.ClassDef):
            if found or target.id not in types:
                types[target.id] = found
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
            and isinstance(scope, ast.ClassDef)
        ):
            types[f"self.{target.attr}"] = found
        elif isinstance(target, ast.Name) and isinstance(scope, ast.ClassDef) and found:
            types[f"self.{target.id}"] = found  # a class-level annotation


def _bound(target: ast.AST) -> Iterator[ast.AST]:
    """The names and attributes a target binds (tuples unpacked)."""
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _bound(element)
    elif isinstance(target, ast.Starred):
        yield from _bound(target.value)
    elif isinstance(target, ast.Name | ast.Attribute):
        yield target


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """Nodes of `scope` itself: nested functions are their own scopes (a class sees all,
    to find the ``self.x = ...`` of its methods)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        nested = isinstance(node, FunctionLike | ast.ClassDef)
        if not nested or isinstance(scope, ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))
