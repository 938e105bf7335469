"""Memory per queued job (issue 24): jobs sent with the same description share its JobDescription and
Request, and a queued job holds no list or dict of its own; nothing a job changes is shared."""

from __future__ import annotations

import pytest
from core_env import CLIENT, CoreEnv, true

from pilot.core.phase import Phase
from pilot.model.job_state import JobState

pytestmark = pytest.mark.timeout(10)


def test_identical_jobs_share_their_description_and_request_but_not_their_state() -> None:
    env = CoreEnv(cores=1, pilot={"backlog": 1})
    a, b, *rest, c = env.submit(*[true()] * 8, true(arguments=["x"]))
    ja, jb, jc = env.job(a), env.job(b), env.job(c)
    assert all(env.job(i).description is ja.description and env.job(i).request is ja.request for i in [b, *rest])
    assert jc.description is not ja.description and jc.description.arguments == ["x"]
    assert ja.run is not jb.run and ja.metadata is None and ja.subscribers == (CLIENT,)
    env.register()  # one core: a runs, b waits behind its core, the others in the queue
    assert len(ja.run.processes) == 1 and len(ja.run.ranks) == 1
    assert jb.phase is Phase.BEHIND and len(jb.run.processes) == 1 and jb.run.processes is not ja.run.processes
    waiting = [env.job(i) for i in rest if env.job(i).phase is Phase.QUEUED]
    assert waiting
    for jd in waiting:
        assert not jd.run.processes and not jd.run.ranks and not jd.run.taken and not jd.run.results
    env.started("n0", a)
    env.exited("n0", a, code=3, max_rss=7)
    env.step()
    assert env.state(a) is JobState.FAILED and env.told(a)[3] == 3
    assert jb.metadata is None and not jb.run.results and waiting[-1].metadata is None  # a's end left them alone
    env.started("n0", b)
    env.exited("n0", b)
    env.step()
    assert env.state(b) is JobState.COMPLETED and env.told(b)[3] == 0
    assert ja.metadata is not jb.metadata and ja.metadata is not None and ja.metadata.get("max_rss") == 7
    assert len(ja.run.results) == 1 and ja.run.results is not jb.run.results


def test_a_value_refused_once_is_refused_again_whatever_it_equals() -> None:
    """1 == 1.0 == True in Python: the shared descriptions must tell them apart, or a description
    from_wire refuses would be taken for one it accepted."""
    env = CoreEnv()
    base = {"executable": "/bin/true"}
    ok, again, wrong = env.core.on_submit(
        CLIENT,
        [
            {**base, "inherit_environment": True},
            {**base, "inherit_environment": True},
            {**base, "inherit_environment": 1},
        ],
        None,
    )
    assert "id" in ok and "id" in again
    assert "inherit_environment must be true or false" in wrong["error"]
    short, longer = env.core.on_submit(CLIENT, [{**base, "duration": 60}, {**base, "duration": 60.5}], None)
    assert env.job(short["id"]).description.duration == 60.0
    assert env.job(longer["id"]).description.duration == 60.5


def test_jobs_with_dependencies_get_their_own_request() -> None:
    env = CoreEnv()
    (first,) = env.submit(true(name="first"))
    after = true(custom_attributes={"depends_on": [first]})
    x, y = env.submit(after, after)
    assert env.job(x).description is env.job(y).description
    assert env.job(x).request is not env.job(y).request


def test_descriptions_as_the_client_sends_them_share_too_and_tell_their_value_types_apart() -> None:
    # A plain JobSpec's wire form holds strings and numbers only: keyed without walking it.
    env = CoreEnv()
    spec = {"executable": "/bin/true", "name": "t", "duration": 600.0, "submit_directory": "/w"}
    a, b, c, d = (
        env.core.on_submit(CLIENT, [dict(spec)], None)[0]["id"],
        env.core.on_submit(CLIENT, [dict(spec)], None)[0]["id"],
        env.core.on_submit(CLIENT, [{**spec, "duration": 600}], None)[0]["id"],
        env.core.on_submit(CLIENT, [{**spec, "name": "u"}], None)[0]["id"],
    )
    assert env.job(a).description is env.job(b).description and env.job(a).request is env.job(b).request
    assert env.job(c).description is not env.job(a).description and env.job(c).description.duration == 600.0
    assert env.job(d).description.name == "u"
    (flag,) = env.core.on_submit(CLIENT, [{**spec, "inherit_environment": 1}], None)
    assert "inherit_environment must be true or false" in flag["error"]
    kept, refused = env.core.on_submit(
        CLIENT, [{**spec, "inherit_environment": True}, {**spec, "inherit_environment": 1}], None
    )
    assert "id" in kept and "inherit_environment must be true or false" in refused["error"]
