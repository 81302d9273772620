"""Evolutionary search over one task's decisions, ranked by the cost model.

Each round (`Search.propose`): a population grows from the best measured configurations
(and records of other machines, as seeds) by mutation (one or two decisions re-drawn)
and crossover (each decision from one of two parents); the model ranks the unmeasured
children; the top few are measured along with a few random ones (exploration, and
training data where the model is unsure). `Search.tell` adds the measurements. It knows
nothing of kernels: `featurize(decisions)` and the measurement are the caller's, so
tests run it on synthetic spaces.
"""

from __future__ import annotations

import random
from typing import Callable

import numpy as np

from kiln.tune.costmodel import CostModel


def key_of(decisions: dict) -> tuple:
    return tuple(sorted(decisions.items()))


class Search:
    def __init__(self, space: dict[str, list], featurize: Callable[[dict], np.ndarray | None],
                 model: CostModel | None, seed: int = 0, population: int = 48, generations: int = 3,
                 seeds: list[dict] = ()):
        self.space = {k: list(v) for k, v in space.items()}
        self.featurize = featurize
        self.model = model
        self.rng = random.Random(seed)
        self.population, self.generations = population, generations
        self.measured: dict[tuple, float | None] = {}   # decisions -> seconds (None: failed)
        self.seeds = [dict(s) for s in seeds if set(s) <= set(self.space)]
        self._features: dict[tuple, np.ndarray | None] = {}

    # -- what was measured ------------------------------------------------------------
    def tell(self, decisions: dict, seconds: float | None) -> None:
        self.measured[key_of(decisions)] = seconds

    def best(self) -> tuple[dict, float] | None:
        ok = [(s, k) for k, s in self.measured.items() if s is not None]
        if not ok:
            return None
        s, k = min(ok)
        return dict(k), s

    def exhausted(self) -> bool:
        n = 1
        for v in self.space.values():
            n *= len(v)
        return len(self.measured) >= n

    # -- proposing ----------------------------------------------------------------------
    def random(self) -> dict:
        return {k: self.rng.choice(v) for k, v in self.space.items()}

    def mutate(self, d: dict) -> dict:
        out = dict(d)
        for name in self.rng.sample(sorted(self.space), k=min(len(self.space), self.rng.choice((1, 1, 2)))):
            out[name] = self.rng.choice(self.space[name])
        return out

    def crossover(self, a: dict, b: dict) -> dict:
        return {k: (a if self.rng.random() < 0.5 else b)[k] for k in self.space}

    def features(self, d: dict) -> np.ndarray | None:
        k = key_of(d)
        if k not in self._features:
            self._features[k] = self.featurize(d)
        return self._features[k]

    def score(self, cands: list[dict]) -> np.ndarray:
        if self.model is None or not self.model.trained:
            return np.array([self.rng.random() for _ in cands])
        feats = [self.features(c) for c in cands]
        ok = [i for i, f in enumerate(feats) if f is not None]
        out = np.full(len(cands), -np.inf)
        if ok:
            out[ok] = self.model.predict(np.stack([feats[i] for i in ok]))
        return out

    def propose(self, n: int, n_random: int = 2) -> list[dict]:
        """`n` unmeasured configurations: the model's best of an evolved population, and
        `n_random` drawn uniformly."""
        good = sorted(((s, k) for k, s in self.measured.items() if s is not None))[:8]
        first = {k: v[0] for k, v in self.space.items()}   # a decision a record lacks: its default
        parents = [{**first, **dict(k)} for _, k in good] + [{**first, **s} for s in self.seeds]
        if not parents:
            parents = [self.random()]
        pool: dict[tuple, dict] = {}
        for _ in range(self.generations):
            kids = []
            while len(kids) < self.population:
                r = self.rng.random()
                if r < 0.5 or len(parents) < 2:
                    kids.append(self.mutate(self.rng.choice(parents)))
                elif r < 0.8:
                    kids.append(self.crossover(*self.rng.sample(parents, 2)))
                else:
                    kids.append(self.random())
            kids = [c for c in kids if key_of(c) not in self.measured]
            for c in kids:
                pool.setdefault(key_of(c), c)
            if not kids:
                break
            scores = self.score(kids)
            order = np.argsort(-scores)
            parents = [kids[i] for i in order[:max(2, self.population // 4)]] + parents[:4]
        cands = list(pool.values())
        chosen: list[dict] = []
        if cands:
            scores = self.score(cands)
            for i in np.argsort(-scores):
                if len(chosen) >= max(0, n - n_random):
                    break
                if np.isfinite(scores[i]):
                    chosen.append(cands[i])
        taken = {key_of(c) for c in chosen}
        tries = 0
        while len(chosen) < n and tries < 50 * n and not self.exhausted():
            tries += 1
            c = self.random()
            if key_of(c) not in self.measured and key_of(c) not in taken:
                chosen.append(c)
                taken.add(key_of(c))
        return chosen
