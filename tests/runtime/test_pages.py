"""The weights blob in transparent huge pages (kiln.runtime.pages): where the kernel offers them
the blob starts on a huge page and is advised into them; where it does not (or says nothing),
a plain buffer. Either way zeros, writable, of the size asked."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.runtime.pages import huge_page_bytes, zeroed


def fake_thp(tmp_path, enabled: str, size: str = "2097152"):
    (tmp_path / "enabled").write_text(enabled + "\n")
    (tmp_path / "hpage_pmd_size").write_text(size + "\n")
    return str(tmp_path)


@pytest.mark.parametrize("enabled, size, want", [
    ("always [madvise] never", "2097152", 2097152), ("[always] madvise never", "1048576", 1048576),
    ("always madvise [never]", "2097152", 0), ("always madvise never", "2097152", 0),
    ("[madvise]", "garbage", 0), ("[madvise]", "3000000", 0), ("[madvise]", "0", 0)])
def test_huge_page_size_is_read_from_the_kernel(tmp_path, enabled, size, want):
    assert huge_page_bytes(fake_thp(tmp_path, enabled, size)) == want


def test_no_transparent_huge_pages_file_means_none(tmp_path):
    assert huge_page_bytes(str(tmp_path / "absent")) == 0


@pytest.mark.parametrize("enabled, nbytes", [("always [madvise] never", 5 << 20), ("always [madvise] never", 3 << 20),
                                             ("always madvise [never]", 5 << 20), ("always [madvise] never", 4096)])
def test_zeroed_blob_starts_on_a_huge_page_where_offered(tmp_path, enabled, nbytes):
    blob = zeroed(nbytes, fake_thp(tmp_path, enabled))
    assert blob.dtype == np.uint8 and blob.shape == (nbytes,) and blob.flags.writeable and blob.flags.c_contiguous
    assert not blob.any()
    huge = "[madvise]" in enabled and nbytes >= 2 << 20 and hasattr(mmap, "MADV_HUGEPAGE")
    if huge:
        assert blob.ctypes.data % (2 << 20) == 0
    assert isinstance(blob.base, np.ndarray) == huge      # a view of the aligned mapping, or numpy's own
    blob[:] = 7
    assert int(blob[-1]) == 7 and int(blob.sum()) == 7 * nbytes


def matmul_model(k: int) -> bytes:
    w = np.random.default_rng(0).standard_normal((k, k)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", k])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), w


@pytest.mark.skipif(not huge_page_bytes() or not hasattr(mmap, "MADV_HUGEPAGE"),
                    reason="this kernel makes no transparent huge pages")
def test_a_loaded_modules_weights_start_on_a_huge_page(tmp_path, monkeypatch):
    """A module loaded from the cache (a symbolic dim: one module per shape) places its weights
    blob on a huge page, and computes as before."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    model, w = matmul_model(1024)      # 4 MB of weights
    x = np.random.default_rng(1).standard_normal((3, 1024)).astype(np.float32)
    for _ in range(2):                 # built, then loaded from the cache in a new model
        m = kiln.compile(model)
        np.testing.assert_allclose(m.run({"x": x})["y"], x @ w, rtol=1e-4, atol=1e-4)
    runner = m.program.runner_for([x])
    assert runner.weights.ctypes.data % huge_page_bytes() == 0


def mapping_of(address: int) -> tuple[str | None, int]:
    """The permissions (e.g. "rw-p") of this process's mapping holding `address`, and its
    AnonHugePages in kB (/proc/self/smaps)."""
    perms, huge = None, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):
                if perms is not None:
                    break
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= address < hi:
                    perms = parts[1]
            elif perms is not None and parts[0] == "AnonHugePages:":
                huge = int(parts[1])
    return perms, huge


@pytest.mark.skipif(not huge_page_bytes() or not hasattr(mmap, "MADV_HUGEPAGE") or not os.path.exists("/proc/self/smaps"),
                    reason="this kernel makes no transparent huge pages")
def test_the_blob_is_private_memory_in_huge_pages():
    """The blob's mapping is private: a shared anonymous one is shmem, whose huge pages
    /sys/kernel/mm/transparent_hugepage/shmem_enabled governs ("never" by default: ResNet-50's
    115 MB blob had none of its pages huge), not `enabled`."""
    blob = zeroed(6 << 20)
    blob[:] = 1
    perms, _ = mapping_of(blob.ctypes.data)
    assert perms is not None and perms.endswith("p"), perms
