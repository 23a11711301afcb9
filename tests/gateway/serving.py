"""`tollgate serve` for the SDK suites: started with a configuration in a folder of its
own, on a free loopback port, its log kept beside it; ready once `/healthz` answers."""
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Serving:
    """A running `tollgate serve` (TOLLGATE_BIN) of `config`; `env` adds to the environment,
    `args` to the command line; `db` is its store (a SQLite file of its own when absent)."""

    def __init__(self, config, env=None, args=(), db=None):
        self.dir = tempfile.TemporaryDirectory()
        path = os.path.join(self.dir.name, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.log_path = os.path.join(self.dir.name, "serve.log")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [os.environ["TOLLGATE_BIN"], "serve", "--config", path,
             "--db", db or os.path.join(self.dir.name, "state.db"), "--listen", f"127.0.0.1:{port}",
             *args],
            env=dict(os.environ, **(env or {})), stdout=subprocess.DEVNULL, stderr=self.log)
        for _ in range(300):
            try:
                urllib.request.urlopen(self.base + "/healthz", timeout=1)
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("tollgate serve did not start")

    def stop(self):
        self.process.terminate()
        self.process.wait(30)
        self.log.close()
        self.dir.cleanup()
