// E2B's JS SDK, unchanged, against space's E2B endpoint (E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY come from scripts/test-sdks.sh, which also runs the Python suite).
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { CommandExitError, Sandbox } from 'e2b'

const template = process.env.E2B_TEST_TEMPLATE ?? 'debian'

test('commands, files, list and kill through the JS SDK', async () => {
  const tag = `js-${process.pid}-${Date.now()}`
  const sbx = await Sandbox.create(template, { envs: { GREETING: 'hi' }, metadata: { suite: tag } })
  try {
    const out = []
    const result = await sbx.commands.run('echo $GREETING; echo err >&2', { onStdout: (d) => out.push(d) })
    assert.equal(result.stdout, 'hi\n')
    assert.equal(result.stderr, 'err\n')
    assert.equal(out.join(''), 'hi\n')
    await assert.rejects(sbx.commands.run('exit 4'), (e) => e instanceof CommandExitError && e.exitCode === 4)

    const bg = await sbx.commands.run('read x; echo got:$x', { background: true, stdin: true })
    await sbx.commands.sendStdin(bg.pid, 'line\n')
    assert.equal((await bg.wait()).stdout, 'got:line\n')

    await sbx.files.write('/tmp/js/a.txt', 'from js')
    assert.equal(await sbx.files.read('/tmp/js/a.txt'), 'from js')
    assert.deepEqual((await sbx.files.list('/tmp/js')).map((e) => e.name), ['a.txt'])
    assert.equal(await sbx.files.exists('/tmp/js/none'), false)

    // WatchDir: the JS SDK's watch is a server stream.
    await sbx.files.makeDir('/tmp/watched')
    const events = []
    const watch = await sbx.files.watchDir('/tmp/watched', (e) => events.push(e))
    await sbx.files.write('/tmp/watched/new.txt', 'x')
    for (let i = 0; i < 100 && !events.some((e) => e.name === 'new.txt' && e.type === 'create'); i++) {
      await new Promise((r) => setTimeout(r, 100))
    }
    await watch.stop()
    assert.ok(events.some((e) => e.name === 'new.txt' && e.type === 'create'), JSON.stringify(events))

    const listed = await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems()
    assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])
    const info = await sbx.getInfo()
    assert.equal(info.metadata.suite, tag)
  } finally {
    await sbx.kill()
  }
  assert.deepEqual(await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems(), [])
})

test('a sandbox that does not exist is not found', async () => {
  await assert.rejects(Sandbox.connect('ses_doesnotexist00000000'), /not found/)
})
