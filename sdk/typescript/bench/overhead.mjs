// commands.run("true") through the SDK against the same POST /v1/sessions/{id}/exec made with
// a bare fetch, interleaved, n runs each; prints p50/p90 of both and the difference.
//   npm run build && SPACE_URL=… SPACE_API_KEY=… node bench/overhead.mjs [n]
import { performance } from "node:perf_hooks";
import { Session } from "../dist/index.js";

const n = Number(process.argv[2] ?? 200);
const session = await Session.create({ template: process.env.SPACE_TEST_TEMPLATE ?? "busybox" });
try {
  const url = `${session.client.url}/v1/sessions/${session.id}/exec`;
  const headers = { ...session.client.authHeaders(), "content-type": "application/json" };
  const raw = async () => {
    const response = await fetch(url, { method: "POST", headers, body: JSON.stringify({ cmd: ["/bin/sh", "-c", "true"] }) });
    await response.json();
  };
  const sdk = () => session.commands.run("true");
  const times = { sdk: [], raw: [] };
  for (let i = 0; i < 20; i++) await Promise.all([sdk(), raw()]); // warm up
  for (let i = 0; i < n; i++) {
    for (const [name, call] of i % 2 ? [["sdk", sdk], ["raw", raw]] : [["raw", raw], ["sdk", sdk]]) {
      const start = performance.now();
      await call();
      times[name].push(performance.now() - start);
    }
  }
  const pct = (list, p) => [...list].sort((a, b) => a - b)[Math.floor((list.length - 1) * p)];
  for (const name of ["sdk", "raw"]) {
    console.log(`${name}: p50 ${pct(times[name], 0.5).toFixed(2)} ms, p90 ${pct(times[name], 0.9).toFixed(2)} ms (n=${n})`);
  }
  console.log(`added at p50: ${(pct(times.sdk, 0.5) - pct(times.raw, 0.5)).toFixed(2)} ms`);
} finally {
  await session.destroy();
}
