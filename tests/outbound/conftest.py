"""Fixtures for the outbound tests: each misbehaving server, started and stopped."""

from __future__ import annotations
