"""Config sanity beyond syntax, checked by 'pilot up' before it starts anything: settings that are each
valid but together make a pilot that cannot do what its user meant. Refused (``ConfigError``) when the
pilot could run nothing at all; warned (the returned lines) when it runs but not as the config reads."""

from __future__ import annotations

import fnmatch

from pilot.config import Config, ConfigError


def sanity(cfg: Config) -> list[str]:
    warnings: list[str] = []
    margin = cfg.pilot.walltime_margin
    for site in cfg.sites:
        key = f"{site.table}.walltime"
        if site.walltime is not None and site.walltime <= margin:
            raise ConfigError(
                f"{cfg.source}: {key} = {site.walltime:g} s is not longer than pilot.walltime_margin = {margin:g} s: "
                "every task would be stopped as soon as the allocation starts; raise the walltime or lower the margin"
            )
        if site.walltime is None and site.lrm != "local":
            warnings.append(
                f"{cfg.source}: {site.table} ({site.lrm}) has no walltime: the batch system's default limit applies, "
                f"unknown to the pilot, which then cannot stop tasks pilot.walltime_margin before the end nor tell "
                f"whether a job fits in the time left; set {key}"
            )
    local_names = [f"local-{i}" for s in cfg.sites if s.lrm == "local" for i in range(s.nodes)]
    if local_names and all(s.lrm == "local" for s in cfg.sites):
        for pattern, _ in cfg.nodes:
            if not any(fnmatch.fnmatchcase(n, pattern) for n in local_names):
                shown = ", ".join(local_names[:4]) + (", ..." if len(local_names) > 4 else "")
                warnings.append(
                    f"{cfg.source}: [nodes.{pattern!r}] matches no node of this pilot ({shown}): what it sets "
                    "applies nowhere; fix the pattern"
                )
    return warnings
