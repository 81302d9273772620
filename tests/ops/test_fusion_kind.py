"""Every op declares its fusion kind with its definition (OpDef.fusion); the partitioner reads it there.

A kind forgotten in a distant table used to make a new op OPAQUE without a word: now
registering an op without one fails where it is declared.
"""

from __future__ import annotations

import pytest

from kiln.graph.ir import Node
from kiln.ops.registry import REGISTRY, FusionKind, op, register, same_as
from kiln.lower.partition import Kind, kind_of


def test_every_registered_op_declares_a_fusion_kind():
    assert len(REGISTRY) > 200
    undeclared = [key for key, d in REGISTRY.items() if not isinstance(d.fusion, FusionKind)]
    assert undeclared == []


@pytest.mark.parametrize("fusion", [None, 3, "ELEMWISE"])
def test_registering_without_a_fusion_kind_fails_where_the_op_is_declared(fusion):
    with pytest.raises(RuntimeError, match="'KilnTestNoKind'.*without a fusion kind"):
        register("KilnTestNoKind", infer=same_as(0), run=lambda ctx, x: x, fusion=fusion, domain="kiln.test")
    with pytest.raises(RuntimeError, match="without a fusion kind"):
        op("KilnTestNoKind", infer=same_as(0), domain="kiln.test")(lambda ctx, x: x)
    assert ("kiln.test", "KilnTestNoKind") not in REGISTRY


@pytest.mark.parametrize("domain, name, kind", [
    ("", "Relu", Kind.ELEMWISE), ("", "Add", Kind.BROADCAST), ("", "Transpose", Kind.INJECTIVE),
    ("", "Softmax", Kind.REDUCTION), ("", "Conv", Kind.OUT_FUSABLE), ("", "TopK", Kind.OPAQUE),
    ("kiln", "ConvNCHWc", Kind.OUT_FUSABLE), ("kiln", "ToNCHWc", Kind.INJECTIVE),
    ("kiln", "MatMulPacked", Kind.OUT_FUSABLE), ("ai.onnx.ml", "TreeEnsembleRegressor", Kind.OPAQUE),
])
def test_the_partitioner_reads_the_declared_kind(domain, name, kind):
    node = Node(name, [], [], domain=domain)
    assert kind_of(node) == kind == REGISTRY[(domain, name)].fusion


def test_an_unknown_op_is_opaque():
    assert kind_of(Node("NoSuchOp", [], [], domain="example.com")) == Kind.OPAQUE
