"""A fuzzing session, as `kiln fuzz` runs it: a campaign over seeds, then failures shrunk and
saved as regression files, grouped into bug classes (signature + the ops of the shrunk graph:
mismatches share a signature, their minimal graphs tell them apart)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.testing.differential import Campaign, WorkerPool, campaign
from kiln.testing.fuzz_graphs import generate
from kiln.testing.shrink import bug_class, save_regression, shrink_finding


@dataclass
class BugClass:
    key: str                        # signature, or signature|ops of the shrunk graph
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
         do_shrink: bool = True, shrink_per_signature: int = 4, on_result=None, log=None) -> FuzzReport:
    """Fuzz `seeds`; shrink up to `shrink_per_signature` failing seeds of each signature and
    save one regression (under `out_dir`) per bug class."""
    log = log or (lambda msg: None)
    with WorkerPool(workers, timeout) as pool:
        camp = campaign(seeds, levels_per_graph=levels_per_graph, use_ort=use_ort,
                        time_budget=time_budget, pool=pool, on_result=on_result)
        report = FuzzReport(camp)
        for sig, hits in camp.by_signature().items():
            seeds_hit = sorted({s for s, _ in hits})
            if not (do_shrink and out_dir):
                report.classes.append(BugClass(sig, seeds_hit, hits[0][1]))
                continue
            first = {}
            for seed, finding in hits:
                first.setdefault(seed, finding)
            mine: dict = {}
            for seed in seeds_hit[:shrink_per_signature]:
                finding = first[seed]
                case = generate(seed, levels_per_graph)
                log(f"shrinking seed {seed}: {finding}")
                model, feeds = shrink_finding(case.model, case.feeds, finding, pool, use_ort=use_ort)
                key = bug_class(model, sig)
                if key in mine:
                    mine[key].seeds.append(seed)
                    continue
                bc = mine[key] = BugClass(key, [seed], finding, nodes=len(model.graph.node))
                levels = (finding.level,) if finding.level is not None else ()
                bc.saved = save_regression(model, feeds, out_dir, signature=sig, message=str(finding),
                                           seed=seed, levels=levels, key=key)
            classes = list(mine.values())
            classes[0].seeds += seeds_hit[shrink_per_signature:]   # not shrunk: counted with the first
            report.classes += classes
    return report
