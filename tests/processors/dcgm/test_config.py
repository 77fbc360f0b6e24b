"""Config: defaults, the testdata file, a typo, bad values, and what the service says of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gputally.errors import ConfigError
from gputally.pipeline.config import load_config
from gputally.pipeline.registry import Registry
from gputally.processors.dcgm import DcgmConfig, LabelsConfig, factory

TESTDATA = Path(__file__).parent / "testdata"


def section(name: str) -> object:
    return yaml.safe_load((TESTDATA / name).read_text())["processors"]["dcgm"]


def test_defaults_are_dcgm_exporters_label_names() -> None:
    assert factory.parse(None) == DcgmConfig() == factory.parse({}) == factory.parse({"labels": {}})
    assert DcgmConfig().labels.model_dump() == {
        "uuid": "UUID", "index": "gpu", "device": "device", "model": "modelName", "pci_bus_id": "pci_bus_id",
        "driver_version": "DCGM_FI_DRIVER_VERSION", "hostname": "Hostname",
    }


def test_testdata_file_loads() -> None:
    config = factory.parse(section("dcgm.yaml"))
    assert config.labels == LabelsConfig(uuid="gpu_uuid", hostname="node", driver_version=None)
    assert config.labels.index == "gpu"  # roles left out keep their default


def test_a_typo_names_its_key() -> None:
    with pytest.raises(ValidationError) as caught:
        factory.parse(section("dcgm_typo.yaml"))
    assert [(tuple(e["loc"]), e["type"]) for e in caught.value.errors()] == [
        (("labels", "modelname"), "extra_forbidden")]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"labels": {"uuid": None}}, "valid string"),
        ({"labels": {"uuid": ""}}, "at least 1 character"),
        ({"labels": {"hostname": ""}}, "at least 1 character"),
        ({"labels": {"device": 0}}, "valid string"),
        ({"labels": {"hostname": "UUID"}}, "roles 'uuid' and 'hostname' both read label 'UUID'"),
        ({"labels": ["UUID"]}, "valid dictionary"),
        ({"label": {}}, "Extra inputs are not permitted"),
    ],
)
def test_bad_values_are_refused(given: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        factory.parse(given)


def service_document(**changes: object) -> str:
    document = yaml.safe_load((TESTDATA / "service.yaml").read_text())
    document["processors"].update(changes.pop("processors", {}))
    document["service"]["pipelines"].update(changes.pop("pipelines", {}))
    return yaml.safe_dump(document)


def test_the_service_builds_it_from_the_registry() -> None:
    config = load_config(service_document(), registry=Registry.discover(), environ={})
    assert config.processors["dcgm"].config == DcgmConfig()


def test_the_service_reports_a_typo_with_its_key_path() -> None:
    document = service_document(processors={"dcgm": {"labels": {"uuid": "UUID", "hostnmae": "Hostname"}}})
    with pytest.raises(ConfigError) as caught:
        load_config(document, registry=Registry.discover(), environ={})
    assert caught.value.problems == ["processors.dcgm.labels.hostnmae: unknown key"]


def test_the_service_refuses_it_outside_metrics_pipelines() -> None:
    logs = {"receivers": ["otlp"], "processors": ["dcgm"], "exporters": ["debug"]}
    with pytest.raises(ConfigError) as caught:
        load_config(service_document(pipelines={"logs": logs}), registry=Registry.discover(), environ={})
    assert caught.value.problems == ["service.pipelines.logs.processors[0]: 'dcgm' does not support logs pipelines"]
