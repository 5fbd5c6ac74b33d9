"""The local broker's cluster id is passed on kafka-storage's command line: an id
starting with "-" made one start in 64 fail ("--cluster-id: expected one argument")."""

from __future__ import annotations

import base64
import uuid

from tests.servers import kafka_broker


def test_cluster_ids_never_start_with_a_dash():
    # The draws are handed in, not patched into the uuid module: a thread an earlier test
    # left running may draw uuids meanwhile and would take them.
    dash_first = uuid.UUID(bytes=base64.urlsafe_b64decode("-" + "A" * 21 + "=="))
    # The second draw is fixed too: a random one starts with "-" one time in 64 as well.
    plain = uuid.UUID(bytes=base64.urlsafe_b64decode("B" * 21 + "A=="))
    draws = iter([dash_first, dash_first, plain])
    cluster_id = kafka_broker._random_cluster_id(lambda: next(draws))
    assert cluster_id == "B" * 21 + "A"
