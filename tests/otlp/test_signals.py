"""The per-signal table agrees with the OTLP protobuf descriptors it names."""

from __future__ import annotations

import pytest

from gputally.otlp.signals import SIGNALS, Signal


@pytest.mark.parametrize("signal", list(Signal))
def test_field_names_lead_from_request_to_records(signal: Signal) -> None:
    spec = SIGNALS[signal]
    request = spec.request.DESCRIPTOR
    resource = request.fields_by_name[spec.resource_field].message_type
    scope = resource.fields_by_name[spec.scope_field].message_type
    record = scope.fields_by_name[spec.record_field]
    assert record.message_type is not None and record.is_repeated
    assert "resource" in resource.fields_by_name


@pytest.mark.parametrize("signal", list(Signal))
def test_grpc_method_is_the_services_export(signal: Signal) -> None:
    spec = SIGNALS[signal]
    service = spec.request.DESCRIPTOR.file.services_by_name[spec.service.rsplit(".", 1)[1]]
    assert service.full_name == spec.service
    export = service.methods_by_name["Export"]
    assert (export.input_type, export.output_type) == (spec.request.DESCRIPTOR, spec.response.DESCRIPTOR)
    assert spec.grpc_method == f"/{service.full_name}/Export"


@pytest.mark.parametrize("signal", list(Signal))
def test_rejected_field_is_in_partial_success(signal: Signal) -> None:
    spec = SIGNALS[signal]
    response = spec.response()
    setattr(response.partial_success, spec.rejected_field, 3)
    assert spec.response.FromString(response.SerializeToString()).partial_success.ListFields()[0][1] == 3
    assert spec.http_path == f"/v1/{signal.value}"
