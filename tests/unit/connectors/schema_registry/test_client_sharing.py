"""Unpickled registry clients: one per connection in a process (each Spark task unpickles its decoders, and
a client each rebuilt its HTTPS session and fetched every schema id again), a new one in a forked child."""

from __future__ import annotations

import os
import pickle

from connectors.schema_registry.client import SchemaRegistryClient

UNREACHABLE = "http://127.0.0.1:9"  # nothing here is sent: a request would fail


def test_unpickled_clients_of_one_connection_share_the_schemas_fetched() -> None:
    client = SchemaRegistryClient(UNREACHABLE)
    first, second = (pickle.loads(pickle.dumps(client)) for _ in range(2))
    assert first is second and first is not client
    fetched = object()
    first._by_id[7] = fetched  # as a fetch by the first task would leave it
    assert second.schema_by_id(7) is fetched
    other = pickle.loads(pickle.dumps(SchemaRegistryClient(UNREACHABLE, auth=("user", "secret"))))
    assert other is not first and 7 not in other._by_id


def test_a_forked_child_unpickles_a_client_of_its_own() -> None:
    client = SchemaRegistryClient(UNREACHABLE)
    parents = pickle.loads(pickle.dumps(client))
    child = os.fork()
    if child == 0:  # only Python objects are made here: no session is opened
        try:
            os._exit(0 if pickle.loads(pickle.dumps(client)) is not parents else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child took its parent's client"
    assert pickle.loads(pickle.dumps(client)) is parents
