"""The SSS/SGE parts of the pilot config ([attributes], [global], [nodes."<pattern>"]): values checked
against their attribute's type at load, every error naming the key."""

from __future__ import annotations

import pytest

from pilot import config
from pilot.config import ConfigError
from pilot.model.node import NodeConfigured
from pilot.scheduler.attributes import AttributeRegistry
from pilot.site import cluster, match_node, node_capacity

pytestmark = pytest.mark.timeout(10)

GOOD = {
    "attributes": {"License": {"type": "int", "consumable": True}, "scratch": {"type": "memory", "relop": ">="}},
    "global": {"consumables": {"Fluent": 4}, "Machine": "colony"},
    "nodes": {
        "n*": {"features": ["ssd"], "attributes": {"scratch": "10G"}},
        "n1": {"features": ["bigmem"], "consumables": {"License": 1}},
    },
}


def test_levels_merge_by_pattern_in_order() -> None:
    c = config.parse(GOOD)
    n1 = c.node_level("n1")
    assert n1.features == ("ssd", "bigmem")
    assert n1.attributes == {"scratch": "10G"}
    assert n1.consumables == {"License": 1.0}
    assert c.node_level("other").features == ()
    cl = cluster(c, lrm_kind="local")
    assert cl.global_capacity == {"Resource:Fluent": 4.0}
    assert cl.context["Machine"] == "colony" and cl.context["ResourceManagerType"] == "local"
    node = NodeConfigured(name="n1", hostname="h", processors=[0, 1], memory=1 << 30)
    m = match_node(c, cl.registry, node)
    assert m.features == {"ssd", "bigmem"}
    assert m.configured["Resource:License"] == 1.0
    assert m.values.effective(cl.registry)["scratch"] == 10 * 2**30
    assert node_capacity(c, "n1") == {"Resource:License": 1.0}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"nodes": {"x": {"attributes": {"nope": 1}}}}, "nodes.x.attributes.nope: no attribute 'nope'"),
        ({"nodes": {"x": {"consumables": {"License": -1}}}}, "nodes.x.consumables.License = -1"),
        ({"nodes": {"x": {"features": "ssd"}}}, "nodes.x.features must be a list"),
        ({"nodes": {"x": 3}}, "[nodes.x] must be a table"),
        ({"attributes": {"a": {"type": "bogus"}}}, "attributes.a.type must be one of"),
        (
            {"attributes": {"sc": {"type": "memory"}}, "nodes": {"x": {"attributes": {"sc": "lots"}}}},
            "nodes.x.attributes.sc",
        ),
        ({"global": {"Machine": 3}}, "global.Machine must be a non-empty string"),
        ({"global": {"Colour": "red"}}, "unknown key global.Colour"),
        (
            {"attributes": {"scratch": {"type": "memory"}}, "nodes": {"x": {"consumables": {"scratch": 1}}}},
            "is not consumable",
        ),
    ],
)
def test_bad_site_config_names_the_key(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.parse(raw)
    assert message in str(err.value)


def test_registry_builtins_kept() -> None:
    reg = AttributeRegistry.from_config(GOOD["attributes"])  # type: ignore[arg-type]
    assert reg.get("load_avg") is not None and reg.get("License") is not None


@pytest.mark.parametrize("value", [0, -1, 0.01, 5000, "4", True])
def test_journal_checkpoint_mib_out_of_range_says_what_to_give(value: object) -> None:
    with pytest.raises(ConfigError, match="journal_checkpoint_mib"):
        config.parse({"pilot": {"journal_checkpoint_mib": value}})


def test_journal_checkpoint_mib_takes_an_integer() -> None:
    assert config.parse({"pilot": {"journal_checkpoint_mib": 64}}).pilot.journal_checkpoint_mib == 64.0


@pytest.mark.parametrize(
    ("attribute", "global_value", "node_value", "message"),
    [
        ({"type": "string"}, "a", "b", "cannot be overridden on a node"),
        ({"type": "memory", "relop": "<="}, "100G", "200G", "less restrictive"),
        ({"type": "int", "relop": ">="}, 8, 4, "less restrictive"),
    ],
)
def test_a_node_may_not_override_a_global_value_against_its_relop(
    attribute: dict[str, str], global_value: object, node_value: object, message: str
) -> None:
    """SGE section 3: == / != only on one level; <, <=, >, >= only towards more restrictive."""
    raw = {
        "attributes": {"x": attribute},
        "global": {"attributes": {"x": global_value}},
        "nodes": {"n[12]": {"attributes": {"x": node_value}}},
    }
    with pytest.raises(ConfigError) as err:
        config.parse(raw)
    assert "nodes.n[12].attributes.x" in str(err.value) and "global.attributes.x" in str(err.value)
    assert message in str(err.value)


def test_a_node_may_tighten_a_global_value() -> None:
    raw = {
        "attributes": {"x": {"type": "memory", "relop": "<="}, "y": {"type": "int", "relop": ">="}},
        "global": {"attributes": {"x": "100G", "y": 4}},
        "nodes": {"n1": {"attributes": {"x": "50G", "y": 8}}},
    }
    assert config.parse(raw).node_level("n1").attributes == {"x": "50G", "y": 8}


def test_sized_and_typed_consumables() -> None:
    """SSS Disk/Swap/Network (sizes) and typed resources (name:type) on a node."""
    c = config.parse(
        {
            "attributes": {"License": {"type": "int", "consumable": True}},
            "nodes": {"n1": {"consumables": {"Disk": "100G", "Swap": 1024, "License:ESSL2": 2}}},
        }
    )
    assert node_capacity(c, "n1") == {"Disk": 100 * 2**30, "Swap": 1024.0, "Resource:License:ESSL2": 2.0}
    with pytest.raises(ConfigError, match=r"nodes\.n1\.consumables\.Disk"):
        config.parse({"nodes": {"n1": {"consumables": {"Disk": "lots"}}}})
