"""The one exception type kiln raises for anything a user can get wrong."""

from __future__ import annotations

from kiln.names import escape


class KilnError(Exception):
    """A user-facing error: the message says what went wrong and where.

    `node`, `op` and `stage` are optional context; when given they are
    prefixed to the message so every error names the node, op and pass.
    """

    def __init__(self, message: str, *, node: str | None = None, op: str | None = None,
                 stage: str | None = None):
        self.raw_message = message
        self.node = node
        self.op = op
        self.stage = stage
        where = []
        if stage:
            where.append(f"[{stage}]")
        if op or node:
            op = escape(op) if op else op  # op types and names come from untrusted models
            where.append(f"{op or '?'} node {node!r}:" if node is not None else f"{op}:")
        super().__init__(" ".join(where + [message]))


class UnsupportedOpsError(KilnError):
    """Raised before any work is done, listing every unsupported op at once."""

    def __init__(self, missing: list[tuple[str, str, str, int]]):
        # missing: (domain, op_type, node_name, opset)
        self.missing = missing
        lines = [f"  {escape(('' if not d else d + '::') + op)} (opset {v}) at node {name!r}"
                 for d, op, name, v in missing]
        super().__init__(f"{len(missing)} unsupported operator node(s):\n" + "\n".join(lines))


class DTypeMismatchError(KilnError):
    """Inputs that ONNX requires to share an element type (one type variable of the op's
    schema: MatMul's A and B are both T) but do not; every such input of the model at once."""

    def __init__(self, problems: list[tuple[str, str, int, str, str, str, str, int, str]]):
        # problems: (node, op, input index, input name, type variable, expected, given, index matched, its name)
        self.problems = problems
        lines = [f"  {escape(op)} node {node!r}: input {i} ({name!r}) is {given}, expected {want} "
                 f"(type {var}, as input {j} ({jname!r}))"
                 for node, op, i, name, var, want, given, j, jname in problems]
        node, op = (problems[0][0], problems[0][1]) if len(problems) == 1 else (None, None)
        super().__init__(f"{len(problems)} input(s) of the wrong element type (ONNX: the inputs of one type "
                         "variable share one element type; insert a Cast):\n" + "\n".join(lines),
                         stage="infer")
        self.node, self.op = node, op
