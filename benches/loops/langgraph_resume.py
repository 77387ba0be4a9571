"""Scenario 10's LangGraph peer (issue 19, goal 5): resume after a crash, open to first new step.

A graph of one node that counts and loops back to itself, checkpointed by SqliteSaver with
durability="sync" (each step's checkpoint committed before the next step runs), the
configuration whose figures FACTS.md and docs/benchmarks.md compare loops with.

    python langgraph_resume.py seed PATH N    # runs N steps, dies in step N+1 (os._exit),
                                              # then folds the WAL into the file
    python langgraph_resume.py resume PATH    # one resume; prints {"open_us", "entry_us", "resume_us"}

`resume` first warms Python up (imports, the graph's definition, and two steps of the same
graph on an in-memory SQLite saver, so that lazy initialisation is not counted against
LangGraph), then times: opening the connection and the saver and compiling the graph with it
(`open_us`), and `invoke(None)` until the first new step is entered (`entry_us`) and until its
checkpoint is committed, seen at the entry of the step after it (`resume_us`); then it exits at
once, as a crash would.
"""

import json
import os
import sqlite3
import sys
import time
from typing import TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

THREAD = {"configurable": {"thread_id": "target"}, "recursion_limit": 10_000_000}


class State(TypedDict):
    count: int
    note: str


def builder(on_step):
    def step(state: State) -> State:
        on_step(state["count"])
        return {"count": state["count"] + 1, "note": state["note"]}

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step", ["step", END])
    return g


def seed(path: str, n: int) -> None:
    def on_step(count: int) -> None:
        if count == n:
            os._exit(0)

    if os.fork() == 0:
        conn = sqlite3.connect(path, check_same_thread=False)
        graph = builder(on_step).compile(checkpointer=SqliteSaver(conn))
        graph.invoke({"count": 0, "note": "x" * 100}, THREAD, durability="sync")
        os._exit(1)
    _, status = os.wait()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit("seeding failed")
    # Closing the only connection folds the WAL into the file and removes it, so that the
    # file alone is the template.
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def resume(path: str) -> None:
    marks = []

    def on_step(count: int) -> None:
        marks.append(time.perf_counter())
        if len(marks) == 2:
            print(
                json.dumps(
                    {
                        "open_us": (t_open - t0) * 1e6,
                        "entry_us": (marks[0] - t_open) * 1e6,
                        "resume_us": (marks[1] - t_open) * 1e6,
                    }
                ),
                flush=True,
            )
            os._exit(0)

    class Stop(Exception):
        pass

    def warm_step(count: int) -> None:
        if count in (2, 3):
            raise Stop

    memory = sqlite3.connect(":memory:", check_same_thread=False)
    warm = builder(warm_step).compile(checkpointer=SqliteSaver(memory))
    # A first run stopped in its third step, then a resume of it stopped in its next one:
    # both paths warmed.
    for start in ({"count": 0, "note": "x" * 100}, None):
        try:
            warm.invoke(start, THREAD, durability="sync")
        except Stop:
            pass

    g = builder(on_step)
    t0 = time.perf_counter()
    conn = sqlite3.connect(path, check_same_thread=False)
    graph = g.compile(checkpointer=SqliteSaver(conn))
    t_open = time.perf_counter()
    graph.invoke(None, THREAD, durability="sync")
    sys.exit("the graph ended without a second step")


if __name__ == "__main__":
    if sys.argv[1] == "seed":
        seed(sys.argv[2], int(sys.argv[3]))
    else:
        resume(sys.argv[2])
