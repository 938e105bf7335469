"""The per-node agent: registers its node, spawns and watches the processes the daemon orders."""

from __future__ import annotations
