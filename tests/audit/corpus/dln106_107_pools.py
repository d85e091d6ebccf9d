"""DLN106 / DLN107: database pools with no acquire limit, connections with no statement limit."""

from __future__ import annotations

from typing import Any

import asyncpg
import psycopg_pool
import sqlalchemy
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

DSN = "postgresql://app@db.internal/app"
CONNECT_ARGS: dict[str, Any] = {"options": "-c statement_timeout=5000"}


async def asyncpg_pool() -> Any:
    return await asyncpg.create_pool(DSN, min_size=1, max_size=10)  # expect: DLN107


async def asyncpg_pool_bounded() -> Any:
    return await asyncpg.create_pool(DSN, max_size=10, command_timeout=5)


async def asyncpg_pool_server_setting() -> Any:
    return await asyncpg.create_pool(DSN, server_settings={"statement_timeout": "5000"})


async def asyncpg_connection() -> Any:
    return await asyncpg.connect(DSN)  # expect: DLN107


async def asyncpg_acquire(pool: asyncpg.Pool) -> Any:
    async with pool.acquire() as conn:  # expect: DLN106
        return await conn.fetchval("SELECT 1")


async def asyncpg_acquire_bounded(pool: asyncpg.Pool) -> Any:
    async with pool.acquire(timeout=1.0) as conn:
        return await conn.fetchval("SELECT 1")


sync_pool = psycopg_pool.ConnectionPool(DSN, max_size=10)  # expect: DLN106
sync_pool_bounded = ConnectionPool(DSN, max_size=10, timeout=2.0)
async_pool = AsyncConnectionPool(DSN, open=False)  # expect: DLN106
async_pool_bounded = AsyncConnectionPool(DSN, open=False, timeout=1.0)

engine = create_engine("postgresql+psycopg://app@db.internal/app")  # expect: DLN106, DLN107
engine_bounded = create_engine(
    "postgresql+psycopg://app@db.internal/app",
    pool_timeout=2,
    connect_args={"options": "-c statement_timeout=5000"},
)
engine_no_statement_limit = sqlalchemy.create_engine(DSN, pool_timeout=2)  # expect: DLN107
engine_args_elsewhere = create_engine(DSN, pool_timeout=2, connect_args=CONNECT_ARGS)
engine_no_pool = create_engine(DSN, poolclass=NullPool, connect_args=CONNECT_ARGS)
sqlite_engine = create_engine("sqlite:///local.db")
async_engine = create_async_engine(
    "postgresql+asyncpg://app@db.internal/app",
    pool_timeout=2,
    connect_args={"command_timeout": 5},
)
