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


def test_default_is_a_bounded_spin_then_sleep():
    """A fork between the back-to-back kernels of one inference finds the team spinning (kiln
    ms halved at batch 1 on a quiet machine; see kiln.runtime.threads), but the spin is
    bounded (PASSIVE after it), not libgomp's ACTIVE forever."""
    policy, spin = threads.wait_settings({})
    assert (policy, spin) == ("PASSIVE", threads.SPINCOUNT)
    assert 0 < int(spin) <= 100_000        # at most ~1 ms by libgomp's 100000 spins per ms
    assert threads.spins(policy, spin)
    assert threads.fork_us(policy, spin) == threads.FORK_US_SPINNING < threads.FORK_US_SLEEPING


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


VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_PROC_BIND", "OMP_PLACES")


def _env_after_import(env: dict) -> dict:
    """The OpenMP variables a fresh process has after importing kiln's native runtime."""
    code = ("import json, os, kiln.runtime.native; "
            "print(json.dumps({k: os.environ.get(k) for k in VARS}))".replace("VARS", repr(VARS)))
    base = {k: v for k, v in os.environ.items() if k not in VARS}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env, "PYTHONPATH": root},
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_spinning_needs_room_on_the_machine():
    """Spinning threads on an oversubscribed machine were 10-40x slower (see
    kiln.runtime.threads): kiln spins only below 1.5 runnable tasks per core."""
    assert threads.spin_has_room(0.2, 2) and threads.spin_has_room(2.9, 2)
    assert not threads.spin_has_room(3.0, 2) and not threads.spin_has_room(12.0, 2)
    assert threads.spin_has_room(12.0, 16)
    assert threads.spin_has_room(0.0, 0) and not threads.spin_has_room(1.5, 0)   # no cores known: as one


def test_the_runtime_sets_the_defaults_before_any_library_loads():
    env = _env_after_import({})
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert env["GOMP_SPINCOUNT"] in (threads.SPINCOUNT, "0")   # "0" when the machine was loaded
    # spinning threads are bound one per core (two on one core waited out a scheduler tick)
    bound = ("spread", "cores") if env["GOMP_SPINCOUNT"] != "0" else (None, None)
    assert (env["OMP_PROC_BIND"], env["OMP_PLACES"]) == bound
    # either variable set by the user: kiln sets neither
    none = dict.fromkeys(VARS)
    assert _env_after_import({"OMP_WAIT_POLICY": "ACTIVE"}) == {**none, "OMP_WAIT_POLICY": "ACTIVE"}
    assert _env_after_import({"GOMP_SPINCOUNT": "5"}) == {**none, "GOMP_SPINCOUNT": "5"}


def test_targets_record_the_settings_in_their_key():
    named = Target.named("x86-64-v3")
    assert (named.omp_wait_policy, named.omp_spincount) == threads.wait_settings({})
    assert named.threads_spin and named.fork_us == threads.FORK_US_SPINNING
    sleeping = Target.named("x86-64-v3", omp_spincount="0")
    assert not sleeping.threads_spin and sleeping.fork_us == threads.FORK_US_SLEEPING
    assert named.key() != sleeping.key()
