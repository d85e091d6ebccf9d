"""Tests of the lab: `deadlines lab` and its parts, with real processes on loopback."""
