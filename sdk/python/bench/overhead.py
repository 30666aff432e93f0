"""What the SDK adds to a command's round trip: ``commands.run("true")`` through the SDK
against the same request made with a bare httpx client (one kept-alive connection each).

    SPACE_URL=... SPACE_API_KEY=... python bench/overhead.py [-n 200]

The two are interleaved (SDK, raw, SDK, raw, ...) so that drift of the machine affects both
alike. ``run("true")`` sends ``["sh", "-c", "true"]``; the raw call sends the same argv, and
the argv form ``run(["true"])`` is measured against raw ``["true"]`` too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable, Dict, List, Tuple

import httpx

from space_sdk import Client, Session


def percentile(samples: List[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def measure(
    calls: Dict[str, Callable[[], None]], n: int, warmup: int
) -> Tuple[Dict[str, List[float]], Dict[str, float]]:
    """Wall-clock milliseconds of each round trip, and the client's CPU milliseconds per call
    (the part the SDK adds, without the server's and the machine's noise)."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    samples: Dict[str, List[float]] = {name: [] for name in calls}
    cpu: Dict[str, float] = {name: 0.0 for name in calls}
    for _ in range(n):
        for name, call in calls.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            call()
            samples[name].append((time.perf_counter() - start) * 1000)
            cpu[name] += (time.process_time() - start_cpu) * 1000
    return samples, {name: total / n for name, total in cpu.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=200, help="round trips per variant (default 200)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--template", default=os.environ.get("SPACE_TEMPLATE", "busybox"))
    args = parser.parse_args()

    client = Client()
    with Session.create(template=args.template, client=client) as session:
        raw = httpx.Client(base_url=client.url, headers={"Authorization": f"Bearer {client.config.api_key}"})
        path = f"/v1/sessions/{session.id}/exec"

        def raw_call(cmd: List[str]) -> Callable[[], None]:
            def call() -> None:
                response = raw.post(path, json={"cmd": cmd})
                assert response.status_code == 200 and response.json()["exit_code"] == 0, response.text

            return call

        def sdk_call(cmd: object) -> Callable[[], None]:
            def call() -> None:
                assert session.commands.run(cmd).exit_code == 0  # type: ignore[arg-type]

            return call

        calls = {
            'sdk run("true")': sdk_call("true"),
            'raw ["sh","-c","true"]': raw_call(["sh", "-c", "true"]),
            'sdk run(["true"])': sdk_call(["true"]),
            'raw ["true"]': raw_call(["true"]),
        }
        samples, cpu = measure(calls, args.n, args.warmup)
        raw.close()
    client.close()

    print(f"n={args.n} per variant, template {args.template}, milliseconds")
    print(f"{'variant':26} {'p50':>8} {'p90':>8} {'mean':>8} {'client CPU':>11}")
    for name, values in samples.items():
        p50, p90 = percentile(values, 50), percentile(values, 90)
        print(f"{name:26} {p50:8.3f} {p90:8.3f} {statistics.mean(values):8.3f} {cpu[name]:11.3f}")
    for sdk, raw_name in (('sdk run("true")', 'raw ["sh","-c","true"]'), ('sdk run(["true"])', 'raw ["true"]')):
        added = percentile(samples[sdk], 50) - percentile(samples[raw_name], 50)
        print(f"added by the SDK at p50 ({sdk}): {added:+.3f} ms")


if __name__ == "__main__":
    main()
