// A tour of the SDK: run with a server's URL and key in the environment,
//   SPACE_URL=http://127.0.0.1:7070 SPACE_API_KEY=… node build/examples/quickstart.js
// (`npm run pretest` compiles the examples into build/). Uses the busybox template.

import { FileNotFoundError, Session } from "@space/sdk";

async function main(): Promise<void> {
  // Destroyed at the end of the block, also when something in it throws.
  await using session = await Session.create({ template: process.env.SPACE_TEST_TEMPLATE ?? "busybox", env: { GREETING: "hello" } });
  console.log(`session ${session.id} is ${session.state}`);

  // A command to completion.
  const result = await session.commands.run("echo $GREETING from $(hostname)");
  console.log(`exit ${result.exitCode}: ${result.stdout.trim()}`);

  // Streaming output as it comes.
  await session.commands.run("for i in 1 2 3; do echo step $i; sleep 0.2; done", {
    onStdout: (data) => process.stdout.write(`  | ${data}`),
  });

  // Files: write a script, run it, read what it wrote.
  await session.files.write("/root/work/count.sh", "#!/bin/sh\nls /bin | wc -l > /root/work/count.txt\n", { mode: 0o755 });
  await session.commands.run("/root/work/count.sh");
  console.log(`busybox links in /bin: ${(await session.files.read("/root/work/count.txt")).trim()}`);
  try {
    await session.files.read("/root/missing");
  } catch (error) {
    if (error instanceof FileNotFoundError) console.log(`typed error: ${error.code} (${error.status})`);
  }

  // A background command: a handle to wait for, feed, or kill.
  const worker = await session.commands.run("read name; echo hi $name", { background: true, stdin: true });
  await worker.sendStdin("agent\n");
  console.log(`background pid ${worker.pid}: ${(await worker.wait()).stdout.trim()}`);

  // Snapshot, break something, restore.
  const snapshot = await session.snapshot({ name: "clean" });
  await session.files.remove("/root/work", { recursive: true });
  await session.restore(snapshot);
  console.log(`restored: count.txt exists again: ${await session.files.exists("/root/work/count.txt")}`);

  // Fork: two independent copies of the session as it is now.
  const forks = await session.fork(2);
  try {
    const outputs = await Promise.all(forks.map((fork, i) => fork.commands.run(`echo fork ${i} sees $(cat /root/work/count.txt) links`)));
    for (const output of outputs) console.log(output.stdout.trim());
  } finally {
    await Promise.all(forks.map((fork) => fork.destroy()));
  }
}

await main();
