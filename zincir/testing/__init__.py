"""zincir.testing: prove that your agent survives a crash at every durable boundary.

- :func:`crash_test` kills a worker handler's process right before and right after every write
  of its run (every commit, every tool start and end), resumes it in a new process, and checks
  the run: it completes, its log is gap-free, every intent has one result, no effect ran twice,
  its final accepted checkpoint is the uninterrupted run's. ``zincir crash-test`` runs it from
  the shell.
- :func:`effect_ledger` is where a tool records each effect it applies, by
  ``pending.effect_key``, so that a crash test can tell which effect was applied twice.
- :class:`ScriptedModel` plays a list of responses (or a recorded run's) as a model would.
- A pytest plugin (``pytest -p zincir.testing``; it is also registered for pytest when zincir is
  installed) gives fixtures: ``zincir_db`` on either backend, ``scripted_model`` and
  ``zincir_clock``, a clock that skips durable sleeps and wait timeouts.

docs/crash-testing.md is the guide. Nothing here needs pytest, except the plugin's own module.
"""

from .._errors import CrashTestError, ScriptExhausted
from ._checks import workdir
from ._clock import database_clock, skipping_clock
from ._crash import crash_test
from ._ledger import EffectLedger, effect_ledger
from ._model import ScriptedModel, ScriptedResponse
from ._report import Boundary, CrashReport

__all__ = [
    "Boundary",
    "CrashReport",
    "CrashTestError",
    "EffectLedger",
    "ScriptExhausted",
    "ScriptedModel",
    "ScriptedResponse",
    "crash_test",
    "database_clock",
    "effect_ledger",
    "skipping_clock",
    "workdir",
]

# `pytest -p zincir.testing` (and the pytest11 entry point) load this package as a plugin; the
# fixtures live in a module of their own so that importing zincir.testing never imports pytest.
pytest_plugins = ["zincir.testing._pytest"]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("zincir."):
        _obj.__module__ = "zincir.testing"
del _name, _obj
