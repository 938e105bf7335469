"""PSI/J ``pilot.*`` requirements compiled to what matching reads (in process; the end-to-end tests are
in test_resource_semantics.py)."""

from __future__ import annotations

import pytest

from pilot.frontends import psij_requirements
from pilot.model.job_description import DescriptionError, JobDescription, ResourceRequest
from pilot.model.node import NodeConfigured
from pilot.scheduler.attributes import AttributeDefinition, AttributeRegistry, AttributeType, Relop
from pilot.scheduler.cluster import Cluster, MatchNode
from pilot.scheduler.matching import Matcher

pytestmark = pytest.mark.timeout(10)


def cluster() -> Cluster:
    reg = AttributeRegistry([AttributeDefinition("scratch", "", AttributeType.MEMORY, Relop.GE)])
    c = Cluster(registry=reg)
    for i in range(3):
        nc = NodeConfigured(
            name=f"n{i}",
            hostname=f"n{i}",
            processors=[0, 1],
            memory=2**30,
            os="Linux 6.1",
            architecture="x86_64",
            features=["big"] if i == 2 else [],
        )
        c.add(MatchNode.from_configured(nc, reg, fixed={"scratch": f"{10 * (i + 1)}G"}))
    return c


def candidates(custom: dict[str, object], *, processes: int = 1) -> list[str]:
    c = cluster()
    d = JobDescription("/bin/true", resources=ResourceRequest(process_count=processes), custom_attributes=custom)
    [group] = psij_requirements.resolve(d, c).variants[0]
    assert group.task_count == processes
    return [n.name for n in Matcher(c).candidates(group.requirement, group.need)]


def test_hard_requirements_select_nodes() -> None:
    assert candidates({"pilot.feature": "big"}) == ["n2"]
    assert candidates({"pilot.node": "n[0-1]"}, processes=2) == ["n0", "n1"]
    assert candidates({"pilot.node_match": "n[12]"}) == ["n1", "n2"]
    assert candidates({"pilot.attribute.scratch": ">=20G"}) == ["n1", "n2"]
    assert candidates({"pilot.attribute.scratch": "25G"}) == ["n0", "n1"]  # as qsub -l: 25G >= provided
    assert candidates({"pilot.os": "Linux*", "pilot.architecture": "x86*|aarch64"}) == ["n0", "n1", "n2"]


def test_a_preference_ranks_without_excluding() -> None:
    assert candidates({"pilot.prefer.feature": "big"}) == ["n2", "n0", "n1"]
    assert candidates({"pilot.prefer.node": "n1", "pilot.feature": "big"}) == ["n2"]


def test_other_pilot_attributes_are_not_requirements() -> None:
    assert not psij_requirements.has_requirements({"pilot.restartable": True, "pilot.retries": 2, "x": 1})
    assert psij_requirements.has_requirements({"pilot.feature": "big"})


@pytest.mark.parametrize(
    ("custom", "message"),
    [
        ({"pilot.feature": ["a"]}, r"\['pilot.feature'\]: must be text, not list"),
        ({"pilot.feature": " , "}, r"\['pilot.feature'\]: names no feature"),
        ({"pilot.attribute.scratch": "<="}, r"\['pilot.attribute.scratch'\]: '<=' has no value"),
        ({"pilot.attribute.scratch": "~big"}, r"\['pilot.attribute.scratch'\]: .*needs a string type"),
        ({"pilot.resource.License": -1}, r"\['pilot.resource.License'\]: -1 is not an amount"),
        ({"pilot.resource.a b": 1}, r"\['pilot.resource.a b'\]: 'a b' is not a resource name"),
        ({"pilot.prefer.resource.x": 1}, r"\['pilot.prefer.resource.x'\]: a preference names a node kind"),
        ({"pilot.node": "n[3-1]"}, r"\['pilot.node'\]: range 3-1 runs backwards"),
    ],
)
def test_malformed_requirements_name_the_attribute(custom: dict[str, object], message: str) -> None:
    d = JobDescription("/bin/true", custom_attributes=custom)
    with pytest.raises(DescriptionError, match=message):
        psij_requirements.resolve(d, cluster())
