"""The `/debug/ndsz` view: the NameTable as protojson, as upstream's status server renders it."""

from __future__ import annotations

import json

from google.protobuf import json_format

from istio_agent.protos import nds_pb2


def name_table_json(table: nds_pb2.NameTable | None) -> tuple[int, str]:
    """(HTTP status, JSON body): 404 with `{}` before any table arrived, as upstream.

    The body has protojson's shape (`table` -> host -> `ips`, `registry`,
    `shortname`, `namespace`, `altHosts`; empty fields omitted), keys sorted so
    that two renderings of the same table are identical.
    """
    if table is None:
        return 404, "{}"
    return 200, json.dumps(json_format.MessageToDict(table), sort_keys=True)
