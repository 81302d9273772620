"""The bridge from a partitioned graph to one loop-level module (arena plan, call sequence),
and how each op becomes loops: one lowering module per op family, each lowering registered
for an op of kiln.ops with `@lowering(name)` in the table of kiln.lower.context (kiln.ops
knows nothing of it).

Importing this package registers every family's lowerings (one import per line, sorted), so
every lowering is registered wherever lowering happens (kiln.lower.kernel looks them up with
`lowering_of`), whatever was imported before.
"""

from kiln.lower import attention  # noqa: F401
from kiln.lower import conv  # noqa: F401
from kiln.lower import conv_algo  # noqa: F401
from kiln.lower import conv_window  # noqa: F401
from kiln.lower import data_dependent  # noqa: F401
from kiln.lower import detection  # noqa: F401
from kiln.lower import elementwise  # noqa: F401
from kiln.lower import fused_attention  # noqa: F401
from kiln.lower import image  # noqa: F401
from kiln.lower import indexing  # noqa: F401
from kiln.lower import inverted_residual  # noqa: F401
from kiln.lower import loss  # noqa: F401
from kiln.lower import matmul  # noqa: F401
from kiln.lower import ml  # noqa: F401
from kiln.lower import ml_linear  # noqa: F401
from kiln.lower import ml_preprocess  # noqa: F401
from kiln.lower import ml_svm  # noqa: F401
from kiln.lower import ml_trees  # noqa: F401
from kiln.lower import nchwc  # noqa: F401
from kiln.lower import norm  # noqa: F401
from kiln.lower import pool  # noqa: F401
from kiln.lower import quant  # noqa: F401
from kiln.lower import random  # noqa: F401
from kiln.lower import recurrent  # noqa: F401
from kiln.lower import reduce  # noqa: F401
from kiln.lower import rnn  # noqa: F401
from kiln.lower import signal  # noqa: F401
from kiln.lower import strings  # noqa: F401
from kiln.lower import tensor  # noqa: F401
from kiln.lower import training  # noqa: F401
from kiln.lower import winograd  # noqa: F401
from kiln.lower import winograd1d  # noqa: F401
