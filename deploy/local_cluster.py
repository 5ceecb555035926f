#!/usr/bin/env python3
"""N bie-serve replicas behind vllm-router on loopback.

    deploy/setup_router.sh                      # vllm-router from PyPI into build/.venv-router
    deploy/local_cluster.py --replicas 3 --policy cache_aware --port 30000 -- -m default

starts the replicas on free ports (each with its KV events on ipc:// sockets under the run
directory), waits until each answers /health, starts the router in front of them and serves
until Ctrl-C/SIGTERM, then stops the router and drains the replicas (SIGTERM). The classes are
also what tests/server/test_router_e2e.py drives. Standard library only."""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SERVE = os.path.join(ROOT, "build", "bie-serve")
DEFAULT_ROUTER = os.path.join(ROOT, "build", ".venv-router", "bin", "vllm-router")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5.0):
    """(status, body text); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


def parse_metrics(text):
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


class Replica:
    def __init__(self, index, serve_bin, args, run_dir, threads=1):
        self.index = index
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.kv_events = f"ipc://{run_dir}/kv-events-{index}.sock"
        self.kv_replay = f"ipc://{run_dir}/kv-replay-{index}.sock"
        self.log_path = os.path.join(run_dir, f"replica-{index}.log")
        cmd = [serve_bin, "--host", "127.0.0.1", "--port", str(self.port), "--threads",
               str(threads), "--kv-events-endpoint", self.kv_events,
               "--kv-events-replay-endpoint", self.kv_replay, "--kv-events-pod-id",
               f"replica-{index}", *args]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_healthy(self, timeout=180):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"replica {self.index} exited {self.proc.returncode}: "
                                   + open(self.log_path).read()[-2000:])
            if http_get(self.url + "/health", timeout=2)[0] == 200:
                return
            time.sleep(0.1)
        raise RuntimeError(f"replica {self.index} not healthy after {timeout}s")

    def metrics(self):
        status, text = http_get(self.url + "/metrics", timeout=10)
        return parse_metrics(text) if status == 200 else {}

    def signal(self, sig):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout=60):
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        return self.proc.returncode


class Router:
    """vllm-router over the given worker URLs. Health checks every second, one failure marks a
    worker unhealthy, so a dead replica leaves the rotation within a few seconds."""

    def __init__(self, router_bin, workers, policy, run_dir, port=None, extra=()):
        if not os.path.exists(router_bin):
            raise FileNotFoundError(f"{router_bin} missing: run deploy/setup_router.sh")
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.policy = policy
        self.log_path = os.path.join(run_dir, f"router-{policy}-{self.port}.log")
        cmd = [router_bin, "--host", "127.0.0.1", "--port", str(self.port), "--policy", policy,
               "--worker-urls", *workers, "--worker-startup-check-interval", "1",
               "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
               "--health-success-threshold", "1", "--health-check-timeout-secs", "2",
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
               "--log-level", "warning", *extra]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm-router exited {self.proc.returncode}: "
                                   + open(self.log_path).read()[-2000:])
            if http_get(self.url + "/health", timeout=2)[0] == 200:
                return
            time.sleep(0.1)
        raise RuntimeError(f"vllm-router not ready after {timeout}s")

    def workers(self):
        """{worker url: healthy} as the router sees them."""
        status, text = http_get(self.url + "/workers", timeout=5)
        if status != 200:
            return {}
        return {w["url"]: w["is_healthy"] for w in json.loads(text)["workers"]}

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def start_replicas(n, serve_args, run_dir, serve_bin=DEFAULT_SERVE, threads=1):
    replicas = [Replica(i, serve_bin, serve_args, run_dir, threads) for i in range(n)]
    try:
        for r in replicas:
            r.wait_healthy()
    except Exception:
        for r in replicas:
            r.stop(timeout=10)
        raise
    return replicas


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--policy", default="cache_aware",
                    help="vllm-router policy: cache_aware, round_robin, power_of_two, ...")
    ap.add_argument("--port", type=int, default=30000, help="router port (loopback)")
    ap.add_argument("--threads", type=int, default=1, help="compute threads per replica")
    ap.add_argument("--serve-bin", default=DEFAULT_SERVE)
    ap.add_argument("--router-bin", default=DEFAULT_ROUTER)
    ap.add_argument("serve_args", nargs="*", help="after --: bie-serve flags (e.g. -m default)")
    a = ap.parse_args()
    run_dir = tempfile.mkdtemp(prefix="bie-cluster-")
    replicas = start_replicas(a.replicas, a.serve_args, run_dir, a.serve_bin, a.threads)
    router = Router(a.router_bin, [r.url for r in replicas], a.policy, run_dir, port=a.port)
    try:
        router.wait_ready()
        print(f"router ({a.policy}) on {router.url}; replicas:", flush=True)
        for r in replicas:
            print(f"  {r.url}  KV events {r.kv_events} (replay {r.kv_replay})  log {r.log_path}",
                  flush=True)
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        while not stop:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        router.stop()
        for r in replicas:
            r.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
