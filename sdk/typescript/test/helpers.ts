// What every live test shares: the server (from SPACE_URL and SPACE_API_KEY; a test fails,
// never skips, without them) and sessions that are destroyed after the file's tests, whether
// they passed or not.

import { after } from "node:test";
import { Session, type CreateOptions } from "@space/sdk";

export const TEMPLATE = process.env.SPACE_TEST_TEMPLATE ?? "busybox";

/** The server's URL and key; throws (failing the test) when either is unset. */
export function server(): { url: string; apiKey: string } {
  const url = process.env.SPACE_URL;
  const apiKey = process.env.SPACE_API_KEY;
  if (!url || !apiKey) {
    throw new Error(
      "these tests need a live server: set SPACE_URL (e.g. http://127.0.0.1:7070) and SPACE_API_KEY " +
        "(e.g. the admin key in the data dir's admin.key) of a `space serve` with the busybox template",
    );
  }
  return { url, apiKey };
}

const sessions = new Set<Session>();

/** Destroys `session` after this file's tests (also when they fail). */
export function track<T extends Session | Session[]>(session: T): T {
  for (const s of Array.isArray(session) ? session : [session]) sessions.add(s);
  return session;
}

/** A new session of the test template, destroyed after this file's tests. */
export async function newSession(options: CreateOptions = {}): Promise<Session> {
  server();
  return track(await Session.create({ template: TEMPLATE, ...options }));
}

after(async () => {
  const failures: unknown[] = [];
  await Promise.all(
    [...sessions].map(async (s) => {
      if (s.info.state === "destroyed") return;
      try {
        await s.destroy();
      } catch (error) {
        // A session a test already destroyed (or whose id it made up) is fine.
        if ((error as { status?: number }).status !== 404) failures.push(error);
      }
    }),
  );
  sessions.clear();
  if (failures.length) throw new AggregateError(failures, "destroying the tests' sessions failed");
});

/** Collects an async iterable's first `n` items matching `keep`. */
export async function take<T>(source: AsyncIterable<T>, keep: (item: T) => boolean, n = 1): Promise<T[]> {
  const found: T[] = [];
  for await (const item of source) {
    if (keep(item)) found.push(item);
    if (found.length >= n) break;
  }
  return found;
}

/** Resolves once `predicate` holds, polling (for effects that show up a moment later). */
export async function eventually(predicate: () => Promise<boolean> | boolean, what: string, tries = 200): Promise<void> {
  for (let i = 0; i < tries; i++) {
    if (await predicate()) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** A suite still running after this long has hung: it fails rather than stalling the run. */
export const SUITE_TIMEOUT = 600_000;
