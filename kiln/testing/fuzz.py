"""A fuzzing session, as `kiln fuzz` runs it: a campaign over seeds, then each distinct failure
(by signature) shrunk from its first seed and saved as a regression file."""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.testing.differential import Campaign, WorkerPool, campaign
from kiln.testing.fuzz_graphs import generate
from kiln.testing.shrink import save_regression, shrink_finding


@dataclass
class BugClass:
    signature: str
    seeds: list
    example: object                 # a Finding
    saved: str | None = None        # the shrunk regression's path
    nodes: int | None = None        # nodes left after shrinking


@dataclass
class FuzzReport:
    campaign: Campaign
    classes: list = field(default_factory=list)


def fuzz(seeds, *, levels_per_graph: int = 4, workers: int = 0, use_ort: bool = True,
         timeout: float = 120.0, time_budget: float | None = None, out_dir: str | None = None,
         do_shrink: bool = True, on_result=None, log=None) -> FuzzReport:
    """Fuzz `seeds`; shrink and save (under `out_dir`) one regression per distinct failure."""
    log = log or (lambda msg: None)
    with WorkerPool(workers, timeout) as pool:
        camp = campaign(seeds, levels_per_graph=levels_per_graph, use_ort=use_ort,
                        time_budget=time_budget, pool=pool, on_result=on_result)
        report = FuzzReport(camp)
        for sig, hits in camp.by_signature().items():
            seed, finding = hits[0]
            bc = BugClass(sig, sorted({s for s, _ in hits}), finding)
            report.classes.append(bc)
            if not (do_shrink and out_dir):
                continue
            case = generate(seed, levels_per_graph)
            log(f"shrinking seed {seed}: {finding}")
            model, feeds = shrink_finding(case.model, case.feeds, finding, pool, use_ort=use_ort)
            bc.nodes = len(model.graph.node)
            bc.saved = save_regression(model, feeds, out_dir, signature=sig, message=str(finding),
                                       seed=seed, levels=(finding.level,) if finding.level is not None else ())
    return report
