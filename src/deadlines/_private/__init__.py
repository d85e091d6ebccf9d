"""The third-party private APIs `deadlines` relies on: one small module per library.

Each is pinned by ``tests/inbound/test_private_apis.py``, and raises its own
``...Changed`` error when a release of the library no longer has it in the shape read,
never falling back silently. These modules read the objects they are given; none
imports its library.
"""
