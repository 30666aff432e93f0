"""An agent loop: a model proposes code, the sandbox runs it, the output goes back to the model.

The "model" here is a scripted list of steps, so the example runs anywhere; replace
``propose`` with a call to your LLM. Before each step the loop snapshots the session, and a
step that fails is undone with ``restore`` — the agent never has to clean up after itself.

    SPACE_URL=http://127.0.0.1:7070 SPACE_API_KEY=... python examples/agent_loop.py

``SPACE_TEMPLATE`` picks the template (default ``busybox``; the code is POSIX shell).
"""

from __future__ import annotations

import os
from typing import List, Optional

from space_sdk import Session

STEPS = [
    # (file to write, its content, command to run)
    ("/work/data.csv", "name,score\nada,92\nalan,88\ngrace,95\n", None),
    ("/work/stats.sh", "tail -n +2 /work/data.csv | cut -d, -f2 | sort -n | tail -1\n", "sh /work/stats.sh"),
    ("/work/broken.sh", "rm -rf /work/data.csv; exit 1\n", "sh /work/broken.sh"),  # a bad idea, undone
    (
        "/work/report.sh",
        'echo "best: $(sh /work/stats.sh) of $(($(wc -l < /work/data.csv) - 1))"\n',
        "sh /work/report.sh",
    ),
]


def propose(history: List[str]) -> Optional[tuple]:
    """Stands in for the model: the next step given what happened so far."""
    step = len([h for h in history if h.startswith("step")])
    return STEPS[step] if step < len(STEPS) else None


def main() -> None:
    history: List[str] = []
    with Session.create(template=os.environ.get("SPACE_TEMPLATE", "busybox"), idle_timeout=600) as session:
        print(f"session {session.id}")
        while (step := propose(history)) is not None:
            path, content, command = step
            checkpoint = session.snapshot("disk")
            session.files.write(path, content)
            history.append(f"step wrote {path}")
            if command is None:
                continue
            result = session.commands.run(command, timeout=60, on_stdout=lambda text: print("  |", text, end=""))
            if result.exit_code != 0:
                print(f"  step failed (exit {result.exit_code}); restoring {checkpoint.id}")
                session.restore(checkpoint)
                history.append(f"failed: {command}: {result.stderr.strip()}")
            else:
                history.append(f"ran {command}: {result.stdout.strip()}")
        print("files:", sorted(e.name for e in session.files.list("/work")))
        print("report:", session.files.read("/work/report.sh").strip())
        print("last output:", history[-1])


if __name__ == "__main__":
    main()
