"""CPU identity (usable without the compiler) and inputs made from specs."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import KilnError
from kiln.runtime import cpu
from kiln.runtime.inputs import bind_dims, random_inputs
from kiln.runtime.model import TensorSpec


def test_cpu_features_are_the_host_targets(monkeypatch):
    from kiln.targets.target import Target
    assert Target.host().features == cpu.cpu_features()
    assert cpu.machine()
    assert cpu.missing_features(sorted(cpu.cpu_features())) == []
    assert cpu.missing_features(["avx9000_quantum", *cpu.cpu_features()]) == ["avx9000_quantum"]
    # the load check alone can be told what CPU to be (an AVX2 machine, say)
    monkeypatch.setenv("KILN_CHECK_CPU_FEATURES", "avx,avx2, fma")
    assert cpu.missing_features(["avx2", "fma", "avx512f"]) == ["avx512f"]
    assert cpu.cpu_features() == Target.host().features     # detection itself is unchanged


SPECS = [TensorSpec("x", "float32", ("batch", 4)), TensorSpec("ids", "int64", ("batch", "seq")),
         TensorSpec("mask", "bool", (2,))]


def test_random_inputs_are_seeded_and_consistent():
    a = random_inputs(SPECS, {"batch": 3, "seq": 5}, seed=1)
    b = random_inputs(SPECS, {"batch": 3, "seq": 5}, seed=1)
    assert {k: v.shape for k, v in a.items()} == {"x": (3, 4), "ids": (3, 5), "mask": (2,)}
    assert a["x"].dtype == np.float32 and a["ids"].dtype == np.int64 and a["mask"].dtype == bool
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_dims_are_read_off_given_arrays():
    given = {"x": np.zeros((7, 4), np.float32)}
    assert bind_dims(SPECS, given, {"seq": 2}) == {"seq": 2, "batch": 7}
    assert random_inputs(SPECS, {"seq": 2}, given=given)["ids"].shape == (7, 2)


def test_missing_or_unknown_dims_say_which():
    with pytest.raises(KilnError, match=r"symbolic dim\(s\) \['seq'\].*--dim seq=N"):
        random_inputs(SPECS, {"batch": 1})
    with pytest.raises(KilnError, match=r"unknown dim\(s\) \['time'\]"):
        random_inputs(SPECS, {"time": 1})
