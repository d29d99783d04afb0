"""One child process of ``python -m bench.recovery``: ``python -m bench._recovery_child SYSTEM
MODE ARGS_JSON``. It says ``boot`` before importing the system under test (so that the parent can
tell interpreter start-up from import time), then hands over to that system's module; a peer's
package is imported only here."""

from __future__ import annotations

import importlib
import json
import sys

from .ledger import Channel

MODULES = {"zincir": "zincir", "dbos": "dbos", "langgraph": "langgraph"}


def main() -> None:
    system, mode, raw = sys.argv[1:4]
    channel = Channel()
    channel.emit("boot")
    module = importlib.import_module(f"bench.recovery.{MODULES[system]}")
    channel.emit("imported")
    module.main(mode, channel, json.loads(raw))


if __name__ == "__main__":
    main()
