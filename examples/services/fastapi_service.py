"""A FastAPI service calling another service (httpx) and Postgres (asyncpg) in one budget.

    pip install 'deadlines[fastapi,httpx,asyncpg]' uvicorn
    python examples/services/fastapi_service.py --port 8000 --dsn postgresql://127.0.0.1/postgres

    curl -H 'x-request-timeout-ms: 1500' localhost:8000/orders/7              # 200
    curl -H 'x-request-timeout-ms: 300' 'localhost:8000/orders/7?delay=1'     # 504

GET /orders/{id} calls GET /pricing/{id} over HTTP (this same service stands in for the
pricing service, so the time left travels on as ``x-request-timeout-ms``) and reads
Postgres inside ``statement_timeout`` set from what is left. ``delay`` makes pricing slow.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import uvicorn
from fastapi import FastAPI, HTTPException, Request

import deadlines
import deadlines.asyncpg
import deadlines.httpx
from deadlines.asgi import DeadlineMiddleware

PRICING = deadlines.Dependency("pricing", connect=0.5, headers=1.0, total=2.0, pool_size=20)


def make_app(port: int, dsn: str) -> FastAPI:
    """The service, calling itself on `port` as its pricing dependency."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with (
            asyncpg.create_pool(dsn, min_size=1, max_size=5) as pool,
            deadlines.httpx.AsyncClient(PRICING, base_url=f"http://127.0.0.1:{port}") as client,
        ):
            app.state.pool, app.state.pricing = pool, client
            yield

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(DeadlineMiddleware, default=2.0, maximum=10.0)

    @app.get("/pricing/{item}")
    async def pricing(item: int, delay: float = 0.0) -> dict[str, float]:
        await asyncio.sleep(delay)  # a slow pricing service; cancelled at its deadline
        return {"price": item * 1.5, "budget_left": deadlines.remaining()}

    @app.get("/orders/{item}")
    async def order(item: int, request: Request, delay: float = 0.0) -> dict[str, float]:
        price = await request.app.state.pricing.get(f"/pricing/{item}", params={"delay": delay})
        if price.status_code == 504:  # pricing ran out of the budget we passed on: so do we
            raise HTTPException(504, "pricing ran out of time")
        price.raise_for_status()
        async with deadlines.asyncpg.transaction(request.app.state.pool) as conn:
            stock = await conn.fetchval("SELECT $1::int * 10", item)
        return {"price": price.json()["price"], "stock": stock, "left": deadlines.remaining()}

    return app


def main() -> None:
    """Serve on loopback until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dsn", default="postgresql://127.0.0.1/postgres")
    args = parser.parse_args()
    uvicorn.run(
        make_app(args.port, args.dsn), host="127.0.0.1", port=args.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
