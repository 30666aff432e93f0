"""Time from sandbox create to the first output of `echo hi`: through E2B's Python SDK against
space's E2B endpoint, and through space's own Python SDK against the same server, interleaved
(E2B, space, E2B, ...) so that drift of the machine affects both alike. Each sandbox is killed
after its sample (not timed).

    E2B_API_URL=... E2B_SANDBOX_URL=... SPACE_URL=... SPACE_API_KEY=... \\
        python tests/e2b/bench.py [-n 100] [--template debian]

scripts/bench-e2b.sh starts a server of its own and runs this.
"""

import argparse
import json
import os
import time
import urllib.request

from e2b import Sandbox
from space_sdk import Session


def percentile(samples, p):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def e2b_sample(template):
    first = []
    start = time.perf_counter()
    sandbox = Sandbox.create(template=template, timeout=60)
    sandbox.commands.run("echo hi", on_stdout=lambda _: first.append(time.perf_counter()) if not first else None)
    elapsed = (first[0] - start) * 1000
    sandbox.kill()
    return elapsed


def space_sample(template):
    first = []
    start = time.perf_counter()
    session = Session.create(template)
    session.commands.run("echo hi", on_stdout=lambda _: first.append(time.perf_counter()) if not first else None)
    elapsed = (first[0] - start) * 1000
    session.destroy()
    return elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=100)
    parser.add_argument("--template", default="debian")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    request = urllib.request.Request(
        os.environ["SPACE_URL"] + "/v1/keys",
        method="POST",
        data=json.dumps({"tenant": "bench-e2b"}).encode(),
        headers={"Authorization": "Bearer " + os.environ["SPACE_API_KEY"], "Content-Type": "application/json"},
    )
    key = json.loads(urllib.request.urlopen(request).read())["key"]
    os.environ["E2B_API_KEY"] = key
    os.environ["SPACE_API_KEY"] = key
    for _ in range(args.warmup):
        e2b_sample(args.template)
        space_sample(args.template)
    samples = {"e2b-sdk": [], "space-sdk": []}
    for _ in range(args.n):
        samples["e2b-sdk"].append(e2b_sample(args.template))
        samples["space-sdk"].append(space_sample(args.template))
    print(f"create -> first output of `echo hi`, template {args.template}, n={args.n} each, interleaved")
    for name, values in samples.items():
        print(
            f"{name:10} p50 {percentile(values, 50):7.1f} ms  p90 {percentile(values, 90):7.1f} ms  "
            f"p99 {percentile(values, 99):7.1f} ms  min {min(values):6.1f} ms"
        )


if __name__ == "__main__":
    main()
