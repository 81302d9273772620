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
