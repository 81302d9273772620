"""Testing tools that ship with kiln: fuzzers and the sandbox they run cases in.

The differential fuzzer (`kiln fuzz`): random valid ONNX graphs, compiled at every -O level
and compared with the interpreter (and ONNX Runtime), failures shrunk to minimal regressions.

- `fuzz_graphs`: a seeded generator of valid models (`generate(seed)`), built from
  `fuzz_builder` (`GraphBuilder`: values with known shapes, dtypes and value ranges),
  `fuzz_elementwise`, `fuzz_anchors` and `fuzz_views` (its segments).
- `differential`: one case checked in-process (`check_case`), a pool of worker
  subprocesses with time and memory limits (`WorkerPool`), a campaign over seeds.
- `shrink`: delta debugging over a failing model's nodes, keeping the failure signature,
  and saving the result as a replayable `.onnx` (+ `.npz` inputs).

The mutation fuzzer (`kiln fuzz-mutate`): `mutate` (mutated models and artifacts), run in
`sandbox` workers.

They depend on onnx (and optionally onnxruntime), which kiln's compiler does not.
"""
