"""API keys (revocation, rotation, expiry) and tenant quotas (issue 15, branch ``keys``)."""

from __future__ import annotations

import time

import pytest

from conftest import TEMPLATE, unique
from space_sdk import AuthenticationError, Client, PermissionDeniedError, QuotaExceededError, Session


def test_a_revoked_key_fails_on_its_next_request(admin, server):
    created = admin.keys.create(unique("keys"), name="ci")
    assert created.key and created.id and created.name == "ci"
    tenant_client = Client(server["url"], created.key)
    assert tenant_client.templates()
    listed = {k.id: k for k in admin.keys.list()}
    assert created.id in listed and listed[created.id].revoked_at is None
    admin.keys.revoke(created.id)
    with pytest.raises(AuthenticationError) as revoked:
        tenant_client.templates()
    assert (revoked.value.status, revoked.value.code) == (401, "key_revoked")
    assert {k.id: k for k in admin.keys.list()}[created.id].revoked_at is not None


def test_rotation_replaces_the_key(admin, server):
    old = admin.keys.create(unique("rotate"), name="svc")
    new = admin.keys.rotate(old.id)
    assert new.key != old.key and (new.tenant, new.name) == (old.tenant, "svc")
    assert Client(server["url"], new.key).templates()
    with pytest.raises(AuthenticationError) as revoked:
        Client(server["url"], old.key).templates()
    assert revoked.value.code == "key_revoked"


def test_an_expired_key_says_so(admin, server):
    created = admin.keys.create(unique("expiring"), expires_in=1)
    assert created.expires_at is not None
    deadline = time.monotonic() + 30
    while True:
        try:
            Client(server["url"], created.key).templates()
        except AuthenticationError as e:
            assert e.code == "key_expired"
            break
        assert time.monotonic() < deadline, "the key never expired"
        time.sleep(0.5)


def test_a_quota_refuses_the_next_create_naming_the_limit(admin, server):
    tenant = unique("quota")
    key = admin.keys.create(tenant).key
    quota = admin.quotas.set(tenant, max_sessions=1)
    assert quota.max_sessions == 1 and quota.max_cpus is None
    with Client(server["url"], key) as tenant_client:
        made = [Session.create(template=TEMPLATE, client=tenant_client)]
        try:
            assert admin.quotas.get(tenant).usage.sessions == 1
            try:
                made.append(Session.create(template=TEMPLATE, client=tenant_client))
            except QuotaExceededError as refused:
                assert (refused.status, refused.code) == (429, "quota_exceeded")
                assert "session" in refused.message, refused.message
            else:
                pytest.fail("a second session was created beyond max_sessions=1")
            try:
                made.extend(made[0].fork())
            except QuotaExceededError:
                pass
            else:
                pytest.fail("a fork was created beyond max_sessions=1")
        finally:
            for session in made:  # this tenant's sessions are not swept by the fixtures
                session.destroy()


def test_a_session_token_reaches_its_session_and_forks_only(client, server, session):
    token = session.create_token(["read", "exec", "fork"], ttl_secs=600, name="sub-agent")
    assert token.key and token.scope == {"session_id": session.id, "scopes": ["read", "exec", "fork"]}
    sub = Client(server["url"], token.key)
    mine = sub.connect_session(session.id)
    assert mine.commands.run(["echo", "hi"]).stdout.strip() == "hi"
    fork = mine.fork(keep=True)[0]
    try:
        assert fork.commands.run(["true"]).exit_code == 0
        with pytest.raises(PermissionDeniedError) as refused:
            fork.destroy()
        assert refused.value.code == "forbidden" and "destroy" in str(refused.value)
        with pytest.raises(PermissionDeniedError):
            sub.list_sessions()
    finally:
        client.connect_session(fork.id).destroy()
