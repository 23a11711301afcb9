"""A hostile policy in Python, for tests: what it does is chosen by the request key's
prefix. The host must stop it or show it nothing, and fail closed.

- `loop-`: never returns (fuel runs out);
- `hog-`: grows memory without bound (the memory limit traps);
- `raise-`: raises;
- `sleep-`: sleeps an hour (the sealed clock is ready at once);
- `print-`: prints 100 lines (8 reach the log);
- `peek-`: tries files, the environment, arguments and the network, and refuses
  `too-large` if any of them gives anything;
- `clock-`: plans `estimated_exec_ms` = the wall clock in ms, `optional_context_tokens` =
  the monotonic clock in ms;
- `urandom-`: plans `estimated_exec_ms` = 4 bytes of `os.urandom`;
- anything else: the standard rules.
"""

import os
import sys
import time

import tollgate_policy
from tollgate_policy import Plan, RefusalReason, admit, refuse, standard


def peek():
    """What the sandbox gave away, if anything."""
    found = []
    for path in ["/etc/passwd", "/", ".", "app.py"]:
        try:
            os.listdir(path) if path in ("/", ".") else open(path).read()
            found.append(path)
        except Exception:
            pass
    if os.environ:
        found.append("environ")
    if len(sys.argv) > 1:
        found.append("argv")
    try:
        import socket

        s = socket.socket()
        s.connect(("127.0.0.1", 22))
        found.append("socket")
    except Exception:
        pass
    return found


class Decide(tollgate_policy.Policy):
    NAME = "faulty-python"
    VERSION = "0.1.0"

    def admit(self, req):
        key = req.key
        if key.startswith("loop-"):
            while True:
                pass
        if key.startswith("hog-"):
            hog = []
            while True:
                hog.append(bytearray(1 << 20))
        if key.startswith("raise-"):
            raise RuntimeError("a policy that raises")
        if key.startswith("sleep-"):
            time.sleep(3600)
        if key.startswith("print-"):
            for i in range(100):
                print(f"line {i} of a policy that prints")
        if key.startswith("peek-"):
            found = peek()
            if found:
                print("the sandbox gave away:", found)
                return refuse(RefusalReason.TOO_LARGE, None)
        if key.startswith("clock-"):
            wall = int(time.time() * 1000)
            mono = time.monotonic_ns() // 1_000_000
            return admit(Plan(req.max_output_tokens, mono, wall, None))
        if key.startswith("urandom-"):
            draw = int.from_bytes(os.urandom(4), "little")
            return admit(Plan(req.max_output_tokens, 0, draw, None))
        return standard.admit(req)
