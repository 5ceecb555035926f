"""Helpers for the end-to-end tests: start the real bie-serve on a free loopback port."""
import os
import signal
import socket
import subprocess
import time

import pytest
import requests

SERVE_BIN = os.environ.get("BIE_SERVE_BIN", os.path.join(os.path.dirname(__file__), "..", "..",
                                                         "build", "bie-serve"))
# BIE_E2E_DEVICE=vulkan (ctest server_test_openai_e2e_vulkan): every server runs on that device.
DEVICE = os.environ.get("BIE_E2E_DEVICE")
MODEL = os.path.join(os.environ.get("BIE_HOME", os.path.expanduser("~/.cache/bie")), "models",
                     "SmolLM2-135M-Instruct.Q4_1.gguf")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, *args, api_key=None, env=None):
        if not os.path.exists(MODEL):
            # A missing model fails; BIE_ALLOW_MISSING_MODELS=1 (never set by make test) skips.
            msg = f"model not fetched: {MODEL} (run `make models`)"
            if os.environ.get("BIE_ALLOW_MISSING_MODELS") == "1":
                pytest.skip(msg + "; skipped because BIE_ALLOW_MISSING_MODELS=1")
            pytest.fail(msg, pytrace=False)
        self.port = free_port()
        self.api_key = api_key
        cmd = [SERVE_BIN, "--host", "127.0.0.1", "--port", str(self.port), "--threads", "2",
               *args]
        if DEVICE:
            cmd += ["--device", DEVICE]
            if "--drain-timeout" not in args:
                # lavapipe (a CPU Vulkan driver) compiles each shader on first use and runs a
                # 135M model at a few tokens per second: running requests get longer to finish.
                cmd += ["--drain-timeout", "300"]
        if api_key:
            cmd += ["--api-key", api_key]
        self.log_path = f"/tmp/bie-serve-test-{self.port}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=None if env is None else {**os.environ, **env})
        self.url = f"http://127.0.0.1:{self.port}"
        self.saw_loading = False
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"bie-serve exited {self.proc.returncode}: {self.logs()}")
            try:
                r = requests.get(self.url + "/health", timeout=2)
                if r.status_code == 200:
                    return
                assert r.status_code == 503, r.text
                self.saw_loading = True
            except requests.ConnectionError:
                pass
            time.sleep(0.05)
        raise RuntimeError("bie-serve did not become healthy: " + self.logs())

    def headers(self):
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def logs(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def metrics(self):
        text = requests.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
        return out

    def used_blocks(self):
        return sum(v for k, v in self.metrics().items() if k.startswith("bie_kv_blocks_used"))

    def wait_idle(self, timeout=30):
        """Polls /metrics until no request runs or waits; returns the used-block gauge."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = self.metrics()
            if m.get("bie_requests_running", 1) == 0 and m.get("bie_requests_waiting", 1) == 0:
                return self.used_blocks()
            time.sleep(0.1)
        raise AssertionError("server did not go idle: " + str(self.metrics()))

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        self.log.close()
        return self.proc.returncode
