"""Hostile ONNX files: every rejection is a KilnError naming the tensor, node or field.

The reproductions from the untrusted-input issue (part 6): external data with a bad
offset, length or location, a huge sparse index, an opset from the future, and
names carrying terminal escape sequences.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import kiln
from kiln.errors import KilnError
from kiln.names import escape, printable

F = onnx.TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17, sparse=(), name="m"):
    g = helper.make_graph(nodes, name, inputs, outputs, list(inits), sparse_initializer=list(sparse))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _external(tmp_path, **fields):
    (tmp_path / "weights.bin").write_bytes(np.arange(8, dtype=np.float32).tobytes())
    w = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    w.data_location = onnx.TensorProto.EXTERNAL
    w.ClearField("raw_data")
    for k, v in {"location": "weights.bin", "offset": "0", "length": "16", **fields}.items():
        e = w.external_data.add()
        e.key, e.value = k, v
    m = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")],
               [helper.make_tensor_value_info("x", F, [4])], [helper.make_tensor_value_info("y", F, [4])], [w])
    path = tmp_path / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return str(path)


def test_external_data_at_an_offset_loads(tmp_path):
    g = kiln.load_onnx(_external(tmp_path, offset="16"))
    np.testing.assert_array_equal(g.nodes[0].inputs[1].const, np.arange(4, 8, dtype=np.float32))


@pytest.mark.parametrize("fields, match", [
    ({"offset": "-4"}, r"offset '-4' is not a non-negative integer"),
    ({"offset": "four"}, r"offset 'four' is not a non-negative integer"),
    ({"offset": "1e3"}, r"offset '1e3'"),
    ({"length": str(2 ** 63)}, r"length '9223372036854775808' is not a non-negative integer"),
    ({"length": "-16"}, r"length '-16'"),
    ({"length": "8"}, r"8 bytes at offset 0 .*needs 16 bytes"),
    ({"offset": "24"}, r"16 bytes at offset 24 of 'weights.bin' \(32 bytes\)"),
    ({"offset": str(2 ** 61)}, r"at offset 2,305,843,009,213,693,952"),
    ({"location": "weights.bin\0/etc/passwd"}, r"NUL character"),
    ({"location": ""}, r"empty"),
])
def test_bad_external_data_is_a_kiln_error(tmp_path, fields, match):
    with pytest.raises(KilnError, match=match) as e:
        kiln.load_onnx(_external(tmp_path, **fields))
    assert "tensor 'w'" in str(e.value)


def _sparse_model(indices, dims=(4,)):
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "w")
    idx = numpy_helper.from_array(np.array(indices, np.int64), "w_idx")
    st = helper.make_sparse_tensor(values, idx, list(dims))
    return _model([helper.make_node("Identity", ["w"], ["y"], name="id")], [],
                  [helper.make_tensor_value_info("y", F, None)], sparse=[st])


def test_sparse_initializer_loads():
    y = kiln.compile(_sparse_model([1, 3]), target="interpreter").run({})["y"]
    np.testing.assert_array_equal(y, [0, 1, 0, 2])


@pytest.mark.parametrize("indices, dims, match", [
    ([1, 2 ** 40], (4,), "an index is outside its"),
    ([1, -1], (4,), "an index is outside its"),
    ([[0, 1], [5, 0]], (2, 2), "an index is outside its"),
    ([[0], [1]], (2, 2), r"indices of shape \(2, 1\)"),
    ([1, 2, 3], (4,), r"indices of shape \(3,\)"),
])
def test_bad_sparse_initializer_is_a_kiln_error(indices, dims, match):
    with pytest.raises(KilnError, match=match) as e:
        kiln.load_onnx(_sparse_model(indices, dims))
    assert "sparse tensor 'w'" in str(e.value)


def test_huge_sparse_shape_is_a_resource_error():
    from kiln.limits import KilnResourceError
    with pytest.raises(KilnResourceError, match="sparse tensor 'w'.*TiB"):
        kiln.load_onnx(_sparse_model([1, 3], (1 << 40, 1 << 10)))


def test_negative_dims_in_a_tensor():
    w = onnx.TensorProto(name="w", data_type=F, dims=[-2, 2])
    m = _model([helper.make_node("Identity", ["w"], ["y"])], [], [helper.make_tensor_value_info("y", F, None)], [w])
    with pytest.raises(KilnError, match=r"tensor 'w' has negative dims \[-2, 2\]"):
        kiln.load_onnx(m)


@pytest.mark.parametrize("domain, version", [("", 999), ("", 0), ("ai.onnx.ml", 99)])
def test_opsets_beyond_kiln_are_refused(domain, version):
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [2])],
               [helper.make_tensor_value_info("y", F, [2])])
    m.opset_import.append(helper.make_opsetid(domain, version)) if domain else None
    if not domain:
        m.opset_import[0].version = version
    with pytest.raises(KilnError, match=rf"version {version} is not supported; kiln implements versions 1 to \d+"):
        kiln.load_onnx(m)


def test_custom_domains_keep_their_own_versions():
    """Only the standard domains have a known range; a custom domain's version is its own."""
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [2])],
               [helper.make_tensor_value_info("y", F, [2])])
    m.opset_import.append(helper.make_opsetid("com.example", 999))
    kiln.load_onnx(m)


ESC = "\x1b[2J\x1b[31mpwned\x07"


def test_escape_helpers():
    assert escape("plain name/0") == "plain name/0"
    assert escape("a" + ESC) == "a\\x1b[2J\\x1b[31mpwned\\x07"
    assert escape("rtl\u202egnp.exe") == "rtl\\u202egnp.exe"
    assert escape("two\nlines", keep="\n") == "two\nlines"
    assert "\x1b" not in printable(ESC)


def _named_model(path):
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="relu" + ESC),
                helper.make_node("FancyOp" + ESC, ["y"], ["z"], name="bad" + ESC)],
               [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("z", F, [2])],
               name="graph" + ESC)
    m.producer_name = "evil" + ESC
    onnx.save(m, path)


def _kiln(capsys, *args):
    from kiln.cli import main
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_cli_prints_names_with_control_characters_escaped(tmp_path, capsys):
    path = tmp_path / "names.onnx"
    _named_model(path)
    rc, out, err = _kiln(capsys, "inspect", path)
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "\\x1b" in out  # shown, escaped: the user still sees what the model holds
    rc, out, err = _kiln(capsys, "run", path, "--random", "-t", "interpreter")
    assert rc == 1 and "\x1b" not in out + err and "\\x1b" in err


def test_error_messages_escape_names():
    m = _model([helper.make_node("Relu", ["nope" + ESC], ["y"], name="n" + ESC)],
               [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])])
    with pytest.raises(KilnError) as e:
        kiln.load_onnx(m)
    assert "\x1b" not in str(e.value) and "\\x1b" in str(e.value)


def test_unsupported_op_types_are_escaped_too():
    m = _model([helper.make_node("Fancy" + ESC, ["x"], ["y"], name="n")],
               [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])])
    with pytest.raises(KilnError) as e:
        kiln.load_onnx(m)
    assert "\x1b" not in str(e.value) and "Fancy\\x1b" in str(e.value)


# ---- found by the mutation fuzzer (kiln fuzz-mutate), each a regression test

def test_more_inputs_than_the_op_takes():
    m = _model([helper.make_node("OptionalGetElement", ["x", "x", "x"], ["y"], name="oge")],
               [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])])
    with pytest.raises(KilnError, match=r"OptionalGetElement node 'oge'.*takes 1 inputs, the node has 3"):
        kiln.load_onnx(m)


def test_rank_read_off_a_huge_shape_vector():
    """Col2Im's output rank is the length of its image_shape input, declared 2^62 here:
    inference made a tuple of 2^62 symbols (a hang) before the rank was bounded."""
    m = _model([helper.make_node("Col2Im", ["x", "s", "b"], ["y"], name="c2i")],
               [helper.make_tensor_value_info("x", F, [1, 4, 5]),
                helper.make_tensor_value_info("s", onnx.TensorProto.INT64, [2 ** 62]),
                helper.make_tensor_value_info("b", onnx.TensorProto.INT64, [2])],
               [helper.make_tensor_value_info("y", F, None)], opset=18)
    with pytest.raises(KilnError, match="Col2Im node 'c2i'.*rank 4,611,686,018,427,387,904.*at most 64"):
        kiln.load_onnx(m)


def test_argmax_of_int4_compiles_and_agrees():
    """Reductions over int4 needed the identity of a dtype NumPy's iinfo does not know."""
    import ml_dtypes
    m = _model([helper.make_node("ArgMax", ["x"], ["y"], axis=1, select_last_index=1)],
               [helper.make_tensor_value_info("x", onnx.TensorProto.INT4, [2, 3, 4])],
               [helper.make_tensor_value_info("y", onnx.TensorProto.INT64, None)], opset=21)
    x = np.random.default_rng(3).integers(-8, 8, (2, 3, 4)).astype(ml_dtypes.int4)
    want = kiln.compile(m, target="interpreter").run(x=x)["y"]
    np.testing.assert_array_equal(kiln.compile(m, target="cpu").run(x=x)["y"], want)
    np.testing.assert_array_equal(want[:, 0], 2 - np.argmax(x.astype(np.int8)[:, ::-1], axis=1))


def test_a_lowering_that_fails_is_a_kiln_error(monkeypatch, tmp_path):
    import kiln.lower.kernel as kernel
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))  # a cold cache: lowering runs

    def broken(*a, **k):
        raise ValueError("a bug in a lowering")
    monkeypatch.setattr(kernel, "_lower_group", broken)
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [helper.make_tensor_value_info("x", F, [7])],
               [helper.make_tensor_value_info("y", F, [7])])
    with pytest.raises(KilnError, match=r"\[lower\] Relu node 'r': lowering failed: ValueError: a bug"):
        kiln.compile(m, target="cpu")


@pytest.mark.parametrize("op, attrs, match", [
    ("Softmax", {"axis": [1, 2]}, r"attribute 'axis' must be an int like its default -1, got a list \[1, 2\]"),
    ("LeakyRelu", {"alpha": "x"}, r"attribute 'alpha' must be a float .*got a string 'x'"),
])
def test_attribute_of_the_wrong_kind_is_named(op, attrs, match):
    """A list where an int is meant used to fail inside the op (TypeError, wrapped)."""
    m = _model([helper.make_node(op, ["x"], ["y"], name="n", **attrs)],
               [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])])
    with pytest.raises(KilnError, match=match):
        kiln.compile(m, target="interpreter").run(x=np.ones((2, 3), np.float32))


def test_string_input_holding_floats_is_refused():
    m = _model([helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action="UPPER")],
               [helper.make_tensor_value_info("x", onnx.TensorProto.STRING, [2])],
               [helper.make_tensor_value_info("y", onnx.TensorProto.STRING, None)])
    for target in ("interpreter", "cpu"):
        c = kiln.compile(m, target=target)
        assert list(c.run(x=np.array(["a", "b"], dtype=object))["y"]) == ["A", "B"]
        with pytest.raises(KilnError, match=r"input 'x': a string tensor must hold str .*given a float"):
            c.run(x=np.array([1.5, "b"], dtype=object))


@pytest.mark.parametrize("target", ["interpreter", "cpu"])
@pytest.mark.parametrize("max_skip", [1, 10 ** 12])
def test_tfidf_with_a_huge_max_gram_length_ends(target, max_skip):
    """Both loops once ran over every n up to max_gram_length (10^12), and the kernel over
    every skip up to max_skip_count: only pooled lengths and skips within the row count."""
    m = _model([helper.make_node("TfIdfVectorizer", ["x"], ["y"], mode="TF", min_gram_length=1,
                                 max_gram_length=10 ** 12, max_skip_count=max_skip, ngram_counts=[0, 2],
                                 ngram_indexes=[0, 1, 2], pool_int64s=[2, 3, 5, 4])],
               [helper.make_tensor_value_info("x", onnx.TensorProto.INT64, [6])],
               [helper.make_tensor_value_info("y", F, None)], opset=9)
    x = np.array([2, 3, 5, 4, 5, 2], np.int64)
    got = kiln.compile(m, target=target).run(x=x)["y"]
    # unigram 2 twice, 3 once; bigram (5, 4) once at skip 0 (a wider skip finds no other)
    np.testing.assert_array_equal(got, [2, 1, 1])


def test_stft_with_the_signal_as_its_frame_step_is_a_kilnerror():
    """Found by `kiln fuzz-mutate --seed 500` (input 1 rewired to the signal): the run-time kernel
    that sizes a data-dependent output raised ValueError from inside lowering."""
    m = _model([helper.make_node("STFT", ["signal", "signal", "", "frame_length"], ["y"])],
               [helper.make_tensor_value_info("signal", F, [1, 128, 1]),
                helper.make_tensor_value_info("frame_length", onnx.TensorProto.INT64, [])],
               [helper.make_tensor_value_info("y", F, None)], opset=17)
    feeds = {"signal": np.arange(128, dtype=np.float32).reshape(1, 128, 1),
             "frame_length": np.array(16, np.int64)}
    for target in ("interpreter", "cpu"):
        with pytest.raises(KilnError, match="STFT"):
            kiln.compile(m, target=target).run(feeds)
