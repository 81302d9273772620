"""The graph-level IR: types, values, nodes, graphs, their text form and verifier."""

# the text printer first: importing it registers how a Graph prints (kiln.graph.ir.register_printer)
from kiln.graph.text import parse_graph, print_graph  # noqa: F401
from kiln.graph.ir import Graph, Node, Value, const_value  # noqa: F401
from kiln.graph.types import Dim, OptionalType, SequenceType, TensorType, Type, tensor  # noqa: F401
from kiln.graph.verify import verify  # noqa: F401
