"""The Pod field table the Kubernetes API checks writes against (`kubeapi/pod_schema.json`) is generated from the
official `kubernetes` client's models (importing it opens a socket, so this is not a unit test)."""

from __future__ import annotations

import pytest

from istiod_local.controlplane.kubeapi import schema


def test_the_field_table_is_generated_from_the_installed_kubernetes_client() -> None:
    pytest.importorskip("kubernetes")
    assert schema.render(schema.generate()) == schema.SCHEMA_FILE.read_text(), \
        "run `python -m istiod_local.controlplane.kubeapi.schema` to regenerate pod_schema.json"
