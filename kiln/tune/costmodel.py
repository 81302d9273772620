"""The learned cost model: gradient-boosted trees from loop-IR features to relative speed.

Trained online on every measured record of the run (all tasks together: the target is
log(default time / time), a task-independent speedup, as TVM's normalised throughput).
The library is chosen by what is installed: xgboost, else lightgbm, else scikit-learn's
GradientBoostingRegressor (the `tune` extra installs xgboost). `kendall_tau` rates the
ranking the search relies on.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError


def backend() -> str:
    """The first installed library of xgboost, lightgbm, sklearn."""
    for name in ("xgboost", "lightgbm", "sklearn"):
        try:
            __import__(name)
            return name
        except ImportError:
            continue
    raise KilnError("kiln tune needs a gradient-boosting library: pip install 'kiln[tune]' (xgboost)")


def _regressor(name: str, seed: int):
    if name == "xgboost":
        import xgboost  # noqa: PLC0415
        return xgboost.XGBRegressor(n_estimators=120, max_depth=6, learning_rate=0.15, subsample=0.9,
                                    random_state=seed, n_jobs=1, verbosity=0)
    if name == "lightgbm":
        import lightgbm  # noqa: PLC0415
        return lightgbm.LGBMRegressor(n_estimators=120, num_leaves=31, learning_rate=0.15, random_state=seed,
                                      n_jobs=1, verbose=-1, min_child_samples=2)
    from sklearn.ensemble import GradientBoostingRegressor  # noqa: PLC0415
    return GradientBoostingRegressor(n_estimators=120, max_depth=4, learning_rate=0.15, random_state=seed)


class CostModel:
    """predict(features) -> a score, higher is faster; untrained it scores every candidate 0."""

    def __init__(self, library: str | None = None, seed: int = 0):
        self.library = library or backend()
        self.seed = seed
        self._model = None
        self.trained_on = 0

    def fit(self, X: np.ndarray, y: np.ndarray) -> None:
        if len(X) < 4 or np.ptp(y) == 0:
            return
        m = _regressor(self.library, self.seed)
        m.fit(np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64))
        self._model, self.trained_on = m, len(X)

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if self._model is None or len(X) == 0:
            return np.zeros(len(X))
        return np.asarray(self._model.predict(X), dtype=np.float64)

    @property
    def trained(self) -> bool:
        return self._model is not None


def kendall_tau(a, b) -> float:
    """Kendall's tau-b between two rankings (1: same order, -1: reversed; nan: too few)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = len(a)
    if n < 2:
        return float("nan")
    da = np.sign(a[:, None] - a[None, :])
    db = np.sign(b[:, None] - b[None, :])
    iu = np.triu_indices(n, 1)
    da, db = da[iu], db[iu]
    concordant = float(np.sum(da * db))
    denom = np.sqrt(float(np.sum(da != 0)) * float(np.sum(db != 0)))
    return concordant / denom if denom else float("nan")
