from __future__ import annotations

from pilot.cli import main

if __name__ == "__main__":
    main()
