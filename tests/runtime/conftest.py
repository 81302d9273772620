"""Fixtures: the small elementwise model on disk, compiled for cpu and saved as an artifact."""

from __future__ import annotations

import onnx
import pytest

from tests.runtime.models import elementwise_model


@pytest.fixture(scope="package")
def onnx_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "elementwise.onnx"
    onnx.save(elementwise_model(), path)
    return path


@pytest.fixture(scope="package")
def artifact(onnx_path, tmp_path_factory):
    """(path of model.kiln built for batch=2, its manifest)."""
    import kiln
    path = tmp_path_factory.mktemp("artifact") / "model.kiln"
    manifest = kiln.save(kiln.compile(onnx_path, target="cpu"), path, dims={"batch": 2}, source=onnx_path)
    return path, manifest
