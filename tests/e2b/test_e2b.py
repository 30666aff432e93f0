"""E2B's own Python SDK (PyPI `e2b`, pinned in requirements.txt) against `space serve
--e2b-listen`: programs written for E2B, unchanged but for the environment (E2B_API_URL,
E2B_SANDBOX_URL, E2B_API_KEY), which scripts/test-sdks.sh sets.

The sandboxes use the `debian` template (E2B_TEST_TEMPLATE): E2B's commands run under
/bin/bash, which busybox lacks."""

import json
import os
import time
import urllib.request

import pytest
from e2b import (
    CommandExitException,
    FilesystemEventType,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxState,
    Template,
)
from e2b.exceptions import BuildException

TEMPLATE = os.environ.get("E2B_TEST_TEMPLATE", "debian")


def native(method, path, body=None, key=None):
    """A call to space's own API (the admin's key unless `key`)."""
    request = urllib.request.Request(
        os.environ["SPACE_URL"] + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={
            "Authorization": "Bearer " + (key or os.environ["SPACE_API_KEY"]),
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read() or b"null")


@pytest.fixture(scope="session", autouse=True)
def tenant_key():
    """E2B_API_KEY: a key of a tenant of its own, not the admin's."""
    key = native("POST", "/v1/keys", {"tenant": f"e2b-{os.getpid()}"})["key"]
    os.environ["E2B_API_KEY"] = key
    return key


@pytest.fixture
def sbx():
    sandbox = Sandbox.create(template=TEMPLATE, timeout=300)
    yield sandbox
    sandbox.kill()


def wait_until(check, what, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_create_with_envs_and_metadata_then_list_with_filters():
    tag = f"run-{os.getpid()}-{time.time()}"
    a = Sandbox.create(template=TEMPLATE, envs={"GREETING": "hello"}, metadata={"suite": tag, "n": "1"})
    b = Sandbox.create(template=TEMPLATE, metadata={"suite": tag, "n": "2"})
    try:
        assert a.commands.run("echo $GREETING").stdout == "hello\n"
        info = a.get_info()
        assert info.metadata == {"suite": tag, "n": "1"}
        assert info.state == SandboxState.RUNNING
        assert info.template_id == TEMPLATE

        found = Sandbox.list(query=SandboxQuery(metadata={"suite": tag, "n": "2"})).next_items()
        assert [s.sandbox_id for s in found] == [b.sandbox_id]
        paginator = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}), limit=1)
        pages = [paginator.next_items()]
        while paginator.has_next:
            pages.append(paginator.next_items())
        assert len(pages) == 2 and sorted(s.sandbox_id for p in pages for s in p) == sorted(
            [a.sandbox_id, b.sandbox_id]
        )
        b.pause()
        paused = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}, state=[SandboxState.PAUSED])).next_items()
        assert [s.sandbox_id for s in paused] == [b.sandbox_id]
    finally:
        a.kill()
        b.kill()
    assert not Sandbox.list(query=SandboxQuery(metadata={"suite": tag})).next_items()


def test_base_is_the_default_template():
    sandbox = Sandbox.create()
    try:
        default = native("GET", "/v1/status").get("default_template", "busybox")
        assert sandbox.get_info().template_id == default
    finally:
        sandbox.kill()


def test_foreground_commands_stream_their_output_and_fail_with_their_exit_code(sbx):
    out, err = [], []
    result = sbx.commands.run("echo one; echo two >&2", on_stdout=out.append, on_stderr=err.append)
    assert (result.stdout, result.stderr, result.exit_code) == ("one\n", "two\n", 0)
    assert "".join(out) == "one\n" and "".join(err) == "two\n"
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo oops >&2; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stderr == "oops\n"


def test_cwd_user_and_env_of_a_command(sbx):
    sbx.files.make_dir("/srv/work")
    assert sbx.commands.run("pwd", cwd="/srv/work").stdout == "/srv/work\n"
    assert sbx.commands.run("id -u", user="root").stdout == "0\n"
    assert sbx.commands.run("echo $A-$B", envs={"A": "x", "B": "y"}).stdout == "x-y\n"
    with pytest.raises(SandboxException) as no_user:
        sbx.commands.run("true", user="nobody-here")
    assert "does not exist" in str(no_user.value)


def test_background_commands_wait_kill_connect_and_stdin(sbx):
    handle = sbx.commands.run("sleep 0.5; echo done", background=True)
    assert handle.wait().stdout == "done\n"

    sleeper = sbx.commands.run("sleep 300", background=True)
    assert sleeper.pid in [p.pid for p in sbx.commands.list()]
    assert sleeper.kill()
    with pytest.raises(CommandExitException):
        sleeper.wait()
    assert sleeper.pid not in [p.pid for p in sbx.commands.list()]

    # Output is kept for a client that connects later.
    counter = sbx.commands.run("for i in 1 2 3; do echo $i; sleep 0.3; done", background=True)
    counter.disconnect()
    again = sbx.commands.connect(counter.pid)
    assert again.wait().stdout == "1\n2\n3\n"

    reader = sbx.commands.run("read line; echo got:$line", background=True, stdin=True)
    sbx.commands.send_stdin(reader.pid, "hello\n")
    assert reader.wait().stdout == "got:hello\n"
    cat = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(cat.pid, "abc")
    sbx.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "abc"
    assert not sbx.commands.kill(999_999)

    # StreamInput: a client stream of input messages.
    streamed = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.stream_input(streamed.pid, iter(["one ", "two ", b"three"]))
    sbx.commands.close_stdin(streamed.pid)
    assert streamed.wait().stdout == "one two three"


def test_pty_create_resize_and_input(sbx):
    data = []
    terminal = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.resize(terminal.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(terminal.pid, b"stty size; exit\n")
    terminal.wait(on_pty=data.append)
    assert b"30 100" in b"".join(data)


def test_files_text_bytes_streams_and_listing(sbx):
    sbx.files.write("/data/a.txt", "text")
    sbx.files.write("/data/b.bin", bytes(range(256)))
    assert sbx.files.read("/data/a.txt") == "text"
    assert bytes(sbx.files.read("/data/b.bin", format="bytes")) == bytes(range(256))
    assert b"".join(sbx.files.read("/data/a.txt", format="stream")) == b"text"
    with open(__file__, "rb") as source:
        sbx.files.write("/data/deep/copy.py", source)
    with open(__file__, "rb") as source:
        assert sbx.files.read("/data/deep/copy.py") == source.read().decode()

    assert sorted(e.name for e in sbx.files.list("/data")) == ["a.txt", "b.bin", "deep"]
    assert "copy.py" in [e.name for e in sbx.files.list("/data", depth=2)]
    info = sbx.files.get_info("/data/a.txt")
    assert (info.name, info.size, info.type.value) == ("a.txt", 4, "file")
    assert sbx.files.exists("/data/a.txt") and not sbx.files.exists("/data/none")
    assert sbx.files.make_dir("/data/new") and not sbx.files.make_dir("/data/new")
    assert sbx.files.rename("/data/a.txt", "/data/new/a.txt").path == "/data/new/a.txt"
    sbx.files.remove("/data/new")
    assert not sbx.files.exists("/data/new/a.txt")
    with pytest.raises(NotFoundException):
        sbx.files.read("/data/missing")


def test_watch_dir_reports_changes(sbx):
    sbx.files.make_dir("/watched")
    watch = sbx.files.watch_dir("/watched")
    sbx.files.write("/watched/new.txt", "x")
    sbx.files.remove("/watched/new.txt")
    seen = []

    def both():
        seen.extend(watch.get_new_events())
        kinds = {(e.name, e.type) for e in seen}
        return ("new.txt", FilesystemEventType.CREATE) in kinds and ("new.txt", FilesystemEventType.REMOVE) in kinds

    wait_until(both, "create and remove events")
    watch.stop()


def test_watch_events_carry_their_entry_when_asked(sbx):
    """envd 0.6.3's include_entry: a created file's event has its info; a removed one's none.
    allow_network_mounts (0.6.4) is accepted: a sandbox has no network mount to refuse."""
    sbx.files.make_dir("/entries")
    watch = sbx.files.watch_dir("/entries", include_entry=True, allow_network_mounts=True)
    sbx.files.write("/entries/new.txt", "12345")
    sbx.files.remove("/entries/new.txt")
    seen = []

    def both():
        seen.extend(watch.get_new_events())
        types = {e.type for e in seen if e.name == "new.txt"}
        return FilesystemEventType.CREATE in types and FilesystemEventType.REMOVE in types

    wait_until(both, "create and remove events")
    watch.stop()
    created = [e for e in seen if e.type == FilesystemEventType.CREATE and e.entry is not None]
    assert created and created[0].entry.path == "/entries/new.txt", seen
    assert all(e.entry is None for e in seen if e.type == FilesystemEventType.REMOVE), seen


def test_file_metadata_is_kept_as_envd_keeps_it(sbx):
    """envd 0.6.2's metadata: `user.e2b.*` attributes on the file, shown by get_info, list and
    rename (set by anyone), replaced whole by the next upload; bad metadata is a 400."""
    import httpx

    written = sbx.files.write("/tmp/described", "x", metadata={"Owner": "agent 7", "n": "1"})
    assert written.metadata == {"owner": "agent 7", "n": "1"}
    read = 'import os; print(os.getxattr("/tmp/described", "user.e2b.owner").decode())'
    assert sbx.commands.run(f"python3 -c '{read}'").stdout.strip() == "agent 7"
    setter = 'import os; os.setxattr("/tmp/described", "user.e2b.set_by", b"a program")'
    sbx.commands.run(f"python3 -c '{setter}'")
    assert sbx.files.get_info("/tmp/described").metadata == {"owner": "agent 7", "n": "1", "set_by": "a program"}
    listed = [e for e in sbx.files.list("/tmp") if e.name == "described"]
    assert listed[0].metadata["owner"] == "agent 7", listed
    assert sbx.files.rename("/tmp/described", "/tmp/moved").metadata["set_by"] == "a program"
    sbx.files.write("/tmp/moved", "y")
    assert sbx.files.get_info("/tmp/moved").metadata is None
    # What the SDK checks before sending, the sandbox checks again.
    upload = httpx.post(
        f"{os.environ['E2B_SANDBOX_URL']}/files",
        params={"path": "/tmp/refused"},
        headers={"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token, "X-Metadata-K": "v" * 5000},
        content=b"z",
    )
    assert upload.status_code == 400 and "exceeds 4096" in upload.json()["message"], upload.text
    assert not sbx.files.exists("/tmp/refused")


def test_a_template_built_with_e2bs_template_sdk_runs_its_steps(tmp_path):
    """Template.build: RUN, ENV, COPY of the context's files, WORKDIR and USER, as a template
    of the tenant's own that creates start from; a failing step fails the build with its output."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "hello.txt").write_text("from the context")
    name = f"e2b-built-{os.getpid()}"
    template = (
        Template(file_context_path=str(tmp_path))
        .from_template(TEMPLATE)
        .set_envs({"GREETING": "it's $HOME"})
        .run_cmd("echo built > /tmp/built")
        .copy("app", "/srv/app")
        .set_workdir("/srv/app")
    )
    logs = []
    Template.build(template, name, on_build_logs=logs.append)
    assert any("RUN" in str(entry) for entry in logs), logs
    sandbox = Sandbox.create(template=name)
    try:
        assert sandbox.commands.run("cat /tmp/built").stdout == "built\n"
        assert sandbox.commands.run("cat /srv/app/hello.txt").stdout == "from the context"
        assert sandbox.commands.run('printf %s "$GREETING"').stdout == "it's $HOME"
        assert sandbox.commands.run("pwd").stdout.strip() == "/srv/app"
    finally:
        sandbox.kill()
    failing = Template().from_template(TEMPLATE).run_cmd("echo on the way; exit 7")
    with pytest.raises(BuildException) as failed:
        Template.build(failing, name)
    assert "7" in str(failed.value), failed.value
    # The template is listed, exists by name, and deletes through E2B's API.
    import httpx

    api, headers = os.environ["E2B_API_URL"], {"X-API-Key": os.environ["E2B_API_KEY"]}
    listed = {t["templateID"]: t for t in httpx.get(f"{api}/templates", headers=headers).json()}
    assert listed[name]["buildCount"] == 1 and not listed[name]["public"], listed
    assert listed[TEMPLATE]["public"], listed
    assert Template.exists(name) and not Template.exists(f"{name}-missing")
    assert httpx.delete(f"{api}/templates/{name}", headers=headers).status_code == 204
    assert not Template.exists(name)


def test_template_file_uploads_take_only_their_own_link():
    """The COPY upload link is keyed to the tenant, the hash and its expiry: another hash,
    an altered expiry or token, and no token at all are refused before anything is kept."""
    import httpx

    api, headers = os.environ["E2B_API_URL"], {"X-API-Key": os.environ["E2B_API_KEY"]}
    name, hash_a, hash_b = f"e2b-links-{os.getpid()}", "a" * 64, "b" * 64
    link = httpx.get(f"{api}/templates/{name}/files/{hash_a}", headers=headers)
    assert link.status_code == 201 and link.json()["present"] is False, link.text
    url = link.json()["url"]
    assert "token=" in url and "X-API-Key" not in link.text
    path, query = url.split("?", 1)
    params = dict(p.split("=", 1) for p in query.split("&"))
    forged = [
        (path.replace(hash_a, hash_b), params),
        (path, {**params, "expires": str(int(params["expires"]) + 1)}),
        (path, {**params, "token": "0" * len(params["token"])}),
    ]
    for target, query in forged:
        refused = httpx.put(target, params=query, content=b"not a tar")
        assert refused.status_code == 403 and "not valid" in refused.json()["message"], refused.text
    assert httpx.put(path, content=b"x").status_code == 400  # no token: the query is refused
    kept = httpx.put(path, params=params, content=b"any bytes")
    assert kept.status_code == 201, kept.text
    assert httpx.get(f"{api}/templates/{name}/files/{hash_a}", headers=headers).json()["present"] is True
    assert httpx.get(f"{api}/templates/{name}/files/{hash_b}", headers=headers).json()["present"] is False


def test_set_timeout_kills_at_the_new_end():
    sandbox = Sandbox.create(template=TEMPLATE, timeout=600)
    sandbox.set_timeout(2)
    assert sandbox.get_info().end_at.timestamp() < time.time() + 10
    wait_until(lambda: not sandbox.is_running() if _exists(sandbox) else True, "the sandbox to end", 60)
    with pytest.raises(SandboxException):
        Sandbox.connect(sandbox.sandbox_id)


def _exists(sandbox):
    try:
        sandbox.get_info()
        return True
    except SandboxException:
        return False


def test_timeout_with_auto_pause_keeps_a_running_process_and_connect_resumes_it():
    sandbox = Sandbox.create(template=TEMPLATE, timeout=3, lifecycle={"on_timeout": "pause"})
    try:
        counter = sandbox.commands.run("i=0; while true; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.2; done", background=True)
        wait_until(lambda: sandbox.get_info().state == SandboxState.PAUSED, "the pause at timeout", 90)
        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=120)
        assert resumed.get_info().state == SandboxState.RUNNING
        assert counter.pid in [p.pid for p in resumed.commands.list()]
        first = int(resumed.files.read("/tmp/n"))
        wait_until(lambda: int(resumed.files.read("/tmp/n")) > first, "the counter to go on")
    finally:
        sandbox.kill()


def test_an_auto_resumed_sandbox_gets_its_timeout_again():
    """E2B: a call to a sandbox paused at its timeout resumes it, with the create's timeout
    (at least 5 minutes) counted from the resume."""
    sandbox = Sandbox.create(template=TEMPLATE, timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        sandbox.files.write("/tmp/kept", "yes")
        wait_until(lambda: sandbox.get_info().state == SandboxState.PAUSED, "the pause at timeout", 90)
        assert sandbox.commands.run("cat /tmp/kept").stdout == "yes"
        info = sandbox.get_info()
        assert info.state == SandboxState.RUNNING
        assert info.end_at.timestamp() > time.time() + 240, info.end_at
    finally:
        sandbox.kill()


def test_pause_and_connect_keep_processes_and_files(sbx):
    sbx.files.write("/tmp/kept", "yes")
    sleeper = sbx.commands.run("sleep 600", background=True)
    assert sbx.pause()
    assert not sbx.pause()  # already paused: E2B's False
    assert sbx.get_info().state == SandboxState.PAUSED
    sbx.connect()
    assert sbx.get_info().state == SandboxState.RUNNING
    assert sleeper.pid in [p.pid for p in sbx.commands.list()]
    assert sbx.files.read("/tmp/kept") == "yes"


def test_fork_copies_files_and_processes(sbx):
    sbx.files.write("/tmp/origin", "parent")
    sbx.commands.run("sleep 600", background=True)
    forks = sbx.fork(count=2, timeout=120)
    try:
        assert len(forks) == 2
        for child in forks:
            assert not isinstance(child, Exception), child
            assert child.sandbox_id != sbx.sandbox_id
            assert child.files.read("/tmp/origin") == "parent"
            assert any("sleep" in " ".join([p.cmd, *p.args]) for p in child.commands.list())
            child.files.write("/tmp/origin", "child")
        assert sbx.files.read("/tmp/origin") == "parent"
    finally:
        for child in forks:
            if not isinstance(child, Exception):
                child.kill()


def test_snapshots_are_listed_used_as_templates_and_deleted(sbx):
    sbx.files.write("/tmp/state", "at snapshot")
    snapshot = sbx.create_snapshot(name="first")
    assert snapshot.names == ["first"]
    sbx.files.write("/tmp/state", "later")
    listed = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()
    assert [s.snapshot_id for s in listed] == [snapshot.snapshot_id]
    restored = Sandbox.create(snapshot.snapshot_id, metadata={"from": "snapshot"})
    try:
        assert restored.files.read("/tmp/state") == "at snapshot"
        assert restored.get_info().metadata == {"from": "snapshot"}
    finally:
        restored.kill()
    assert Sandbox.delete_snapshot(snapshot.snapshot_id)
    assert not Sandbox.delete_snapshot(snapshot.snapshot_id)


def test_a_snapshot_outlives_the_sandbox_it_was_taken_of():
    sandbox = Sandbox.create(template=TEMPLATE, timeout=300)
    sandbox.files.write("/tmp/state", "kept")
    snapshot = sandbox.create_snapshot()
    sandbox.kill()

    def listed():
        return [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]

    wait_until(lambda: snapshot.snapshot_id in listed(), "the snapshot listed after its sandbox was killed")
    of_killed = Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id).next_items()
    assert [s.snapshot_id for s in of_killed] == [snapshot.snapshot_id]
    restored = Sandbox.create(snapshot.snapshot_id)
    try:
        assert restored.files.read("/tmp/state") == "kept"
    finally:
        restored.kill()
    assert Sandbox.delete_snapshot(snapshot.snapshot_id)
    assert snapshot.snapshot_id not in listed()
    with pytest.raises(SandboxException) as gone:
        Sandbox.create(snapshot.snapshot_id)
    assert snapshot.snapshot_id in str(gone.value)


def test_network_allow_out_becomes_the_session_policy():
    sandbox = Sandbox.create(template=TEMPLATE, network={"allow_out": ["pypi.org", "10.9.8.7"]})
    try:
        policy = native("GET", f"/v1/sessions/{sandbox.sandbox_id}/network", key=os.environ["E2B_API_KEY"])["policy"]
        assert policy["allow"] == ["pypi.org"] and policy["cidrs"] == ["10.9.8.7/32"]
        sandbox.update_network({"allow_out": ["files.pythonhosted.org"]})
        policy = native("GET", f"/v1/sessions/{sandbox.sandbox_id}/network", key=os.environ["E2B_API_KEY"])["policy"]
        assert policy["allow"] == ["files.pythonhosted.org"] and policy["cidrs"] == []
    finally:
        sandbox.kill()


def test_internet_access_is_any_public_host_when_asked():
    """allow_internet_access=True opens the sandbox to any host (`*`, every IPv4 range: the
    gateway still refuses private and the node's addresses); saying nothing is the operator's
    choice, closed on this server (no --e2b-internet-by-default)."""

    def policy(sandbox):
        return native("GET", f"/v1/sessions/{sandbox.sandbox_id}/network", key=os.environ["E2B_API_KEY"])["policy"]

    sandbox = Sandbox.create(template=TEMPLATE, allow_internet_access=True, network={"deny_out": ["evil.example"]})
    try:
        opened = policy(sandbox)
        assert (opened["allow"], opened["cidrs"], opened["deny"]) == (["*"], ["0.0.0.0/0"], ["evil.example"])
        sandbox.update_network({"allow_internet_access": False, "allow_out": ["pypi.org"]})
        closed = policy(sandbox)
        assert (closed["allow"], closed["cidrs"]) == (["pypi.org"], [])
    finally:
        sandbox.kill()
    quiet = Sandbox.create(template=TEMPLATE)
    try:
        assert policy(quiet)["allow"] == []
    finally:
        quiet.kill()


def test_what_space_cannot_honour_fails_with_a_clear_error():
    with pytest.raises(SandboxException) as ranges:
        Sandbox.create(template=TEMPLATE, allow_internet_access=True, network={"deny_out": ["203.0.113.0/24"]})
    assert "allow_internet_access=False" in str(ranges.value)
    with pytest.raises(SandboxException) as unknown:
        Sandbox.create(template="no-such-template")
    assert "no-such-template" in str(unknown.value)
    with pytest.raises(Exception) as missing:
        Sandbox.connect("ses_doesnotexist00000000")
    assert "not found" in str(missing.value)
    sandbox = Sandbox.create(template=TEMPLATE)
    try:
        with pytest.raises(SandboxException) as no_memory:
            sandbox.pause(mode="filesystem")
        assert "501" in str(no_memory.value) and "keeps memory" in str(no_memory.value)
        with pytest.raises(SandboxException) as volumes:
            Sandbox.create(template=TEMPLATE, volume_mounts={"/data": "vol"})
        assert "volumes" in str(volumes.value)
        with pytest.raises(SandboxException) as proxied:
            Sandbox.create(template=TEMPLATE, network={"egress_proxy": {"address": "proxy.test:1080"}})
        assert "501" in str(proxied.value) and "egressProxy" in str(proxied.value)
    finally:
        sandbox.kill()


def test_metrics_report_memory(sbx):
    metrics = sbx.get_metrics()
    assert metrics and metrics[-1].mem_used > 0 and metrics[-1].mem_total >= metrics[-1].mem_used


def test_logs_tell_what_happened_to_the_sandbox(sbx, tenant_key):
    """E2B's logs endpoints (the E2B CLI's `sandbox logs`) answer with the session's events."""
    import httpx

    api, headers = os.environ["E2B_API_URL"], {"X-API-Key": tenant_key}
    sbx.pause()
    sbx.connect()
    path = f"{api}/v2/sandboxes/{sbx.sandbox_id}/logs"
    logs = httpx.get(path, headers=headers).json()["logs"]
    assert {"running", "suspended"} <= {e["fields"].get("to") for e in logs}, logs
    assert all(e["level"] in ("debug", "info", "warn", "error") and e["timestamp"] for e in logs), logs
    newest = httpx.get(path, headers=headers, params={"direction": "backward", "limit": 1}).json()["logs"]
    assert newest == logs[-1:], newest
    v1 = httpx.get(f"{api}/sandboxes/{sbx.sandbox_id}/logs", headers=headers).json()
    assert [line["line"] for line in v1["logs"]] == [e["message"] for e in v1["logEntries"]] and v1["logs"]
    bad = httpx.get(path, headers=headers, params={"direction": "sideways"})
    assert bad.status_code == 400 and "forward or backward" in bad.json()["message"], bad.text
    missing = httpx.get(f"{api}/v2/sandboxes/ses_doesnotexist00000000/logs", headers=headers)
    assert missing.status_code == 404, missing.text


def test_bad_input_gets_e2b_and_connect_errors_never_a_crash(sbx, tenant_key):
    import httpx

    api, envd_url = os.environ["E2B_API_URL"], os.environ["E2B_SANDBOX_URL"]
    other = native("POST", "/v1/keys", {"tenant": f"e2b-other-{os.getpid()}"})["key"]
    # Another tenant's sandbox is not found, through the API and through envd.
    for key in (other, "sk_not_a_key"):
        answer = httpx.get(f"{api}/sandboxes/{sbx.sandbox_id}", headers={"X-API-Key": key})
        assert answer.status_code in (401, 404) and answer.json()["code"] == answer.status_code
    answer = httpx.get(f"{api}/sandboxes/{sbx.sandbox_id}", headers={"X-API-Key": other})
    assert answer.status_code == 404 and "not found" in answer.json()["message"]
    with pytest.raises(Exception) as stranger:
        Sandbox.connect(sbx.sandbox_id, api_key=other)
    assert "not found" in str(stranger.value)
    answer = httpx.post(f"{api}/v2/sandboxes", headers={"X-API-Key": tenant_key}, content=b"{not json")
    assert answer.status_code == 400 and answer.json()["code"] == 400

    def envd(path, body, content_type, token=None, sandbox=None):
        headers = {
            "E2b-Sandbox-Id": sandbox or sbx.sandbox_id,
            "X-Access-Token": token or sbx._envd_access_token,
            "Content-Type": content_type,
        }
        return httpx.post(f"{envd_url}{path}", headers=headers, content=body)

    ls = b'{"path": "/"}'
    assert envd("/filesystem.Filesystem/ListDir", ls, "application/json").status_code == 200
    # E2B's host scheme names the sandbox instead of the header.
    by_host = httpx.post(
        f"{envd_url}/filesystem.Filesystem/Stat",
        headers={
            "Host": f"49983-{sbx.sandbox_id}.{os.environ['E2B_TEST_DOMAIN']}",
            "X-Access-Token": sbx._envd_access_token,
            "Content-Type": "application/json",
        },
        content=b'{"path": "/etc"}',
    )
    assert by_host.status_code == 200 and by_host.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    wrong = envd("/filesystem.Filesystem/ListDir", ls, "application/json", token="0" * 64)
    assert (wrong.status_code, wrong.json()["code"]) == (404, "not_found")  # as for no sandbox
    missing = envd("/filesystem.Filesystem/ListDir", ls, "application/json", sandbox="ses_doesnotexist00000000")
    assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
    bad_json = envd("/filesystem.Filesystem/ListDir", b"{no", "application/json")
    assert (bad_json.status_code, bad_json.json()["code"]) == (400, "invalid_argument")
    assert envd("/filesystem.Filesystem/ListDir", b"\x0a\x01/", "application/proto").status_code == 415

    def stream_error(body):
        answer = envd("/process.Process/Start", body, "application/connect+json")
        assert answer.status_code == 200
        flags, length = answer.content[0], int.from_bytes(answer.content[1:5], "big")
        assert flags == 2, answer.content
        return json.loads(answer.content[5 : 5 + length])["error"]["code"]

    assert stream_error(b"\x00\xff\xff\xff\xff") == "resource_exhausted"  # a 4 GiB message
    assert stream_error(b"\x00\x00\x00\x00\x10{") == "invalid_argument"  # cut short
    assert stream_error(b"\x01\x00\x00\x00\x02{}") == "unimplemented"  # compressed
    assert stream_error(b"\x00\x00\x00\x00\x02{}") == "invalid_argument"  # no command
    # The sandbox still answers.
    assert sbx.commands.run("echo alive").stdout == "alive\n"


SERVER = (
    "perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(LocalPort => 8000, Listen => 5, ReuseAddr => 1)"
    ' or die; while ($c = $s->accept) { while (<$c>) { last if /^\\r?\\n$/ }'
    ' print $c "HTTP/1.0 200 OK\\r\\nContent-Length: 5\\r\\n\\r\\nhello"; close $c }\''
)


def through_host(host, headers=None):
    """A request to `host` (E2B's get_host) sent to the endpoint, as DNS would route it."""
    import httpx

    return httpx.get(os.environ["E2B_API_URL"] + "/", headers={"Host": host, **(headers or {})})


def test_get_host_reaches_a_server_in_the_sandbox(sbx):
    sbx.commands.run(SERVER, background=True)
    host = sbx.get_host(8000)
    assert host == f"8000-{sbx.sandbox_id}.{os.environ['E2B_TEST_DOMAIN']}"
    wait_until(lambda: through_host(host).text == "hello", "the server behind get_host")


def test_ports_of_a_sandbox_without_public_traffic_need_its_traffic_token():
    sandbox = Sandbox.create(template=TEMPLATE, network={"allow_public_traffic": False})
    try:
        sandbox.commands.run(SERVER, background=True)
        host = sandbox.get_host(8000)
        token = {"e2b-traffic-access-token": sandbox.traffic_access_token}
        wait_until(lambda: through_host(host, token).text == "hello", "the server behind get_host")
        refused = through_host(host)
        assert refused.status_code == 401
        assert through_host(host, {"e2b-traffic-access-token": "0" * 64}).status_code == 401
    finally:
        sandbox.kill()
