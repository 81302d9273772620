"""Graph rewrites, one file per pass, and the pipeline per -O level.

The few rewrites that depend on the machine (the NCHWc layout's block, packed weight
panels) read the `Target` in their PassContext, never the host.

Importing this package registers every pass (`PASSES`, by name).
"""

from kiln.passes.registry import PASSES, GraphPass, PassContext, get_pass, graph_pass  # noqa: F401
from kiln.passes import (algebraic, attention, batchnorm_folding, constant_folding,  # noqa: F401
                         conv_transpose, cse, dce, gelu, gemm, inverted_residual, layernorm, layout, merge_gemms, nop_elimination,
                         pack_weights,
                         recurrent, rmsnorm, rotary, swiglu, transpose_sinking)
from kiln.passes.attention import AttentionGroup  # noqa: F401
from kiln.passes.pipeline import LEVELS, passes_for, run_passes  # noqa: F401
from kiln.passes.report import CompileReport  # noqa: F401
from kiln.passes.stats import PassStats  # noqa: F401
