from __future__ import annotations

from agent.main import main

if __name__ == "__main__":
    main()
