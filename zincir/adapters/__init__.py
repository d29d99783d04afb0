"""zincir.adapters: record model responses as the official SDKs return them, and rebuild their
message lists from a run's log.

- :mod:`zincir.adapters.anthropic` (extra ``anthropic``): ``record`` an ``anthropic`` ``Message``
  (every content block, thinking blocks and their signatures included, its ``tool_use`` blocks as
  tool intents, its usage and, with a price table, its cost) in one transaction; ``messages``
  rebuilds the ``MessageParam`` list from :meth:`Run.state`; ``tool_results`` turns results into
  ``tool_result`` blocks; ``create`` is one durable model call (mark, call, record).
- :mod:`zincir.adapters.openai` (extra ``openai``): the same for a ``ChatCompletion`` (its first
  choice) and chat messages.
- Shared by both, and importable without either SDK: :class:`Price` (what a model costs, for the
  ``cost`` of a response) and :func:`run_tools` (execute a run's pending tool intents through
  :meth:`Run.execute`, and decide its checkpoint claims).

docs/adapters.md is the guide.
"""

from ._common import Price
from ._tools import run_tools

__all__ = ["Price", "run_tools"]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("zincir."):
        _obj.__module__ = "zincir.adapters"
del _name, _obj
