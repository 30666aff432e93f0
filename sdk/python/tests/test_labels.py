"""Names, labels and metadata of sessions, and filtered lists (issue 15, branch ``keys``)."""

from __future__ import annotations

import httpx
import pytest

from conftest import TEMPLATE, unique
from space_sdk import BadRequestError, PermissionDeniedError, Session


def test_a_session_carries_its_name_labels_and_metadata(new_session, server):
    team = unique("team")
    session = new_session(name="agent one", labels={"team": team, "env": "test"}, metadata={"task": "t-42"})
    info = session.refresh()
    assert (info.name, info.labels, info.metadata) == ("agent one", {"team": team, "env": "test"}, {"task": "t-42"})
    if server["tenant"] is not None:
        assert info.tenant == server["tenant"]


def test_lists_filter_by_labels_on_the_server(client, new_session, server):
    team = unique("team")
    a = new_session(labels={"team": team, "env": "prod"})
    b = new_session(labels={"team": team, "env": "dev"})
    new_session(labels={"team": unique("other")})
    assert {s.id for s in Session.list(labels={"team": team}, client=client)} == {a.id, b.id}
    assert [s.id for s in Session.list(labels=[f"team={team}", "env=prod"], client=client)] == [a.id]
    # The server filters itself (the SDK filtering again must not be what makes this pass).
    with httpx.Client(base_url=server["url"], headers={"Authorization": f"Bearer {server['key']}"}) as http:
        listed = http.get("/v1/sessions", params=[("label", f"team={team}"), ("label", "env=dev")]).json()
        assert [s["id"] for s in listed["sessions"]] == [b.id]
        running = http.get("/v1/sessions", params={"state": "paused"}).json()
        assert a.id not in [s["id"] for s in running["sessions"]]
        by_template = http.get("/v1/sessions", params={"template": "no-such-template"}).json()
        assert by_template["sessions"] == []


def test_update_replaces_name_labels_and_metadata(new_session):
    session = new_session(name="before", labels={"a": "1"})
    info = session.update(name="after", labels={"b": "2"}, metadata={"k": "v"}, auto_resume=True)
    assert (info.name, info.labels, info.metadata, info.auto_resume) == ("after", {"b": "2"}, {"k": "v"}, True)


def test_bad_labels_are_400(client, track):
    with pytest.raises(BadRequestError) as bad:
        track(Session.create(template=TEMPLATE, labels={"Bad Key!": "x"}, client=client))
    assert bad.value.status == 400 and "Bad Key!" in bad.value.message, bad.value.message


def test_all_tenants_is_for_the_admin(client, admin, session):
    everyone = Session.list(all_tenants=True, client=admin)
    assert session.id in [s.id for s in everyone]
    with pytest.raises(PermissionDeniedError):
        Session.list(all_tenants=True, client=client)
