"""`kiln.compile(..., report=True)` attaches a CompileReport to the model: what the
compiler did to it. The passes fill `passes` and `findings`; fusion, memory
planning and the runtime fill the other fields as they come."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiln.passes.stats import PassStats


@dataclass
class CompileReport:
    opt_level: int
    passes: list[PassStats] = field(default_factory=list)
    fused_groups: list[Any] = field(default_factory=list)     # kernels and the ops in each
    why_not_fused: list[Any] = field(default_factory=list)    # decisions not to fuse, with reasons
    arena_bytes: int | None = None                            # planned intermediate memory
    intermediate_bytes: int | None = None                     # sum of all intermediate tensors
    kernels: int | None = None                                # kernels launched per inference
    arena_peak_live_bytes: int | None = None                  # most bytes live at once (a lower bound)
    inplace_kernels: int | None = None                        # kernels writing over a dead input
    per_shape: bool = False                                   # passes run again per input shape (cpu)
    # symbolic input dims (cpu): "generic" (one module runs every shape), "specialize" (a module
    # per input shape) or "static" (none); `shapes_reason`: why generic was not taken
    shapes: str | None = None
    shapes_reason: str | None = None
    stage_times: Any = None                                   # kiln.timing.StageTimes of compile()
    shape_findings: list[Any] = field(default_factory=list)   # (input shapes, findings) of passes run per shape

    @property
    def findings(self) -> list[Any]:
        return [f for p in self.passes for f in p.findings]

    def add_shapes(self, shapes, stats: list[PassStats]) -> None:
        """Record the findings of the passes run again at input `shapes` (symbolic dims bound)."""
        found = [f for p in stats for f in p.findings]
        if found:
            self.shape_findings.append((tuple(shapes), found))

    @property
    def convs(self) -> list[Any]:
        """Each conv's algorithm and why (kiln.lower.conv_algo.ConvChoice, from the layout pass;
        with symbolic input sizes, from its runs at each input shape)."""
        found = self.findings + [f for _, fs in self.shape_findings for f in fs]
        return [f for f in found if type(f).__name__ == "ConvChoice"]

    @property
    def inverted_residuals(self) -> list[Any]:
        """Each expand/depthwise/project chain found, fused or not and why
        (kiln.passes.inverted_residual.InvertedResidualChoice)."""
        found = self.findings + [f for _, fs in self.shape_findings for f in fs]
        return [f for f in found if type(f).__name__ == "InvertedResidualChoice"]

    def __str__(self) -> str:
        lines = [f"kiln compile report (-O{self.opt_level})"]
        lines += [f"  {p}" for p in self.passes]
        if self.shapes is not None:
            lines.append(f"  shapes: {self.shapes}" + (f" ({self.shapes_reason})" if self.shapes_reason else ""))
        if self.per_shape:
            lines.append("  symbolic input dims: these passes run again on the source graph at each new "
                         "input shape, with the sizes known")
        for shapes, found in self.shape_findings:
            lines.append(f"  at input shapes {', '.join(str(tuple(s)) for s in shapes)}:")
            lines += [f"    {f}" for f in found]
        if self.kernels is not None:
            lines.append(f"  kernels per inference: {self.kernels}")
        if self.arena_bytes is not None:
            lines.append(f"  arena: {self.arena_bytes} bytes"
                         + (f" (peak live {self.arena_peak_live_bytes}; all intermediates: "
                            f"{self.intermediate_bytes})" if self.intermediate_bytes is not None else "")
                         + (f"; {self.inplace_kernels} kernels run in place" if self.inplace_kernels else ""))
        if self.stage_times is not None and self.stage_times.wall:
            lines.append("  compile time per stage (wall, cpu: this process and its C compilers):")
            lines += [f"  {line}" for line in str(self.stage_times).split("\n")]
        if self.fused_groups:
            lines.append("  kernels (fused groups, in call order):")
            lines += [f"    {k:3d}  {g}" for k, g in enumerate(self.fused_groups)]
        if self.why_not_fused:
            lines.append(f"  not fused ({len(self.why_not_fused)}):")
            lines += [f"    {w}" for w in self.why_not_fused]
        return "\n".join(lines)
