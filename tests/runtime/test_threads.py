"""How kiln's OpenMP threads wait between kernels (kiln.runtime.threads): a short spin by
default, the user's settings when given, and what the compiler's Target concludes from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kiln.runtime import threads
from kiln.targets.target import Target


def test_default_is_to_sleep_between_kernels():
    """Spinning threads took 10-100x longer per fork than sleeping ones on the shared 2-core
    machine (load 12; see kiln.runtime.threads), so kiln's threads sleep unless told."""
    policy, spin = threads.wait_settings({})
    assert (policy, spin) == ("PASSIVE", threads.SPINCOUNT)
    assert not threads.spins(policy, spin)
    assert threads.fork_us(policy, spin) == threads.FORK_US_SLEEPING > threads.FORK_US_SPINNING


@pytest.mark.parametrize("env,want,spinning", [
    ({"OMP_WAIT_POLICY": "passive"}, ("PASSIVE", ""), False),
    ({"OMP_WAIT_POLICY": "ACTIVE"}, ("ACTIVE", ""), True),
    ({"GOMP_SPINCOUNT": "0"}, ("", "0"), False),
    ({"GOMP_SPINCOUNT": "infinity"}, ("", "infinity"), True),
    ({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "2000"}, ("PASSIVE", "2000"), True),
])
def test_a_users_settings_win(env, want, spinning):
    assert threads.wait_settings(env) == want
    assert threads.spins(*want) == spinning


def _env_after_import(env: dict) -> dict:
    """The OpenMP variables a fresh process has after importing kiln's native runtime."""
    code = ("import json, os, kiln.runtime.native; "
            "print(json.dumps({k: os.environ.get(k) for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')}))")
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env, "PYTHONPATH": root},
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_the_runtime_sets_the_defaults_before_any_library_loads():
    assert _env_after_import({}) == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": threads.SPINCOUNT or None}
    # either variable set by the user: kiln sets neither
    assert _env_after_import({"OMP_WAIT_POLICY": "ACTIVE"}) == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None}
    assert _env_after_import({"GOMP_SPINCOUNT": "5"}) == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "5"}


def test_targets_record_the_settings_in_their_key():
    named = Target.named("x86-64-v3", threads_impl="omp")
    assert (named.omp_wait_policy, named.omp_spincount) == threads.wait_settings({})
    assert not named.threads_spin and named.fork_us == threads.FORK_US_SLEEPING
    spinning = Target.named("x86-64-v3", omp_spincount="2000", threads_impl="omp")
    assert spinning.threads_spin and spinning.fork_us == threads.FORK_US_SPINNING
    assert named.key() != spinning.key()


def test_the_threads_implementation_is_chosen_by_env_and_enters_the_key(monkeypatch):
    from kiln.errors import KilnError
    assert threads.impl({}) == threads.IMPL_DEFAULT == "pool"   # kiln's pool by default
    assert threads.impl({"KILN_THREADS_IMPL": "omp"}) == "omp"   # the switch back
    assert threads.impl({"KILN_THREADS_IMPL": "Pool"}) == "pool"
    with pytest.raises(KilnError, match="KILN_THREADS_IMPL"):
        threads.impl({"KILN_THREADS_IMPL": "tbb"})
    monkeypatch.setenv("KILN_THREADS_IMPL", "omp")
    omp = Target.host()
    monkeypatch.setenv("KILN_THREADS_IMPL", "pool")
    pool = Target.host()
    assert (omp.threads_impl, pool.threads_impl) == ("omp", "pool")
    assert omp.key() != pool.key() and pool.fork_us == threads.FORK_US_POOL < omp.fork_us
    assert Target.named("x86-64-v3").threads_impl == "pool"
