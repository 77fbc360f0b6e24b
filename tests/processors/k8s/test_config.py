"""Config: defaults, testdata files, a typo, and what only create() can check."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gputally.errors import ConfigError
from gputally.otlp.batch import Signal
from gputally.processors.k8s import K8sConfig, factory
from gputally.processors.k8s.config import DEFAULT_SOCKET
from gputally.processors.k8s.processor import create

from .helpers import context

TESTDATA = Path(__file__).parent / "testdata"


def test_defaults() -> None:
    config = factory.parse(None)
    assert config.mode == "node" and config.pod_resources_enabled()
    assert config.pod_resources.socket == DEFAULT_SOCKET and config.pod_resources.refresh_interval == 10.0
    names = config.pod_resources.resource_names
    assert "nvidia.com/gpu" in names and "amd.com/gpu" in names and "nvidia.com/mig-*" in names
    assert config.proc_root is None and config.deleted_pod_grace == 300.0
    assert config.watch.backoff_max == 30.0 and config.watch.timeout == 300.0
    assert not factory.parse({"mode": "gateway"}).pod_resources_enabled()


def test_testdata_file_loads() -> None:
    config = factory.parse(yaml.safe_load((TESTDATA / "k8s.yaml").read_text())["processors"]["k8s"])
    assert config.mode == "node" and config.node_name == "gpu-node-7"
    assert config.extract.labels == ["app.kubernetes.io/*", "team"]
    assert config.pod_resources.refresh_interval == 5.0 and config.deleted_pod_grace == 120.0
    assert config.watch.timeout == 600.0


def test_a_typo_names_its_key() -> None:
    section = yaml.safe_load((TESTDATA / "k8s_typo.yaml").read_text())["processors"]["k8s"]
    with pytest.raises(ValidationError) as error:
        factory.parse(section)
    assert "refresh_intervall" in str(error.value)


def test_node_mode_needs_a_node_name() -> None:
    config = K8sConfig()
    with pytest.raises(ConfigError, match="node_name"):
        create(config, context(), Signal.METRICS, environ={})
    proc = create(config, context(), Signal.METRICS, environ={"K8S_NODE_NAME": "gpu-node-7"})
    assert proc.runtime.node_name == "gpu-node-7"


def test_paths_that_do_not_exist_fail_at_startup(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kubeconfig"):
        create(K8sConfig(mode="gateway", kubeconfig=tmp_path / "nope"), context(), Signal.METRICS, environ={})
    with pytest.raises(ConfigError, match="proc_root"):
        create(K8sConfig(mode="gateway", proc_root=tmp_path / "nope"), context(), Signal.METRICS, environ={})


def test_bad_values_are_refused() -> None:
    for section in ({"mode": "cluster"}, {"pod_resources": {"refresh_interval": "0s"}},
                    {"pod_resources": {"resource_names": [" nvidia.com/gpu"]}}, {"watch": {"page_size": 0}}):
        with pytest.raises(ValidationError):
            factory.parse(section)
