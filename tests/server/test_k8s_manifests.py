"""deploy/k8s/ cannot be applied here (no cluster), so this checks what it can: the YAML parses,
bie-serve starts with the Deployment's own arguments (loopback and ipc:// substituted for the
pod's addresses), its probes' path answers 200, and every metric the endpoint picker is told to
read is on the replica's /metrics."""
import os
import re

import requests

try:
    import yaml
except ImportError as e:  # fails, never skips
    raise ImportError("test_k8s_manifests needs PyYAML: run scripts/setup_pyenv.sh") from e

from conftest import MODEL, ServerProcess

K8S = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "k8s")


def docs(name):
    with open(os.path.join(K8S, name)) as f:
        return list(yaml.safe_load_all(f))


def test_deployment_args_serve_and_epp_metric_names_exist(tmp_path):
    (dep,) = docs("bie-deployment.yaml")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health", probe
    subst = {"$(BIE_MODEL)": MODEL, "$(POD_IP)": "127.0.0.1"}
    args = []
    for a in c["args"]:
        for k, v in subst.items():
            a = a.replace(k, v)
        flag = a.split("=", 1)[0]
        if flag in ("--host", "--port"):
            continue  # ServerProcess picks loopback and a free port
        if flag == "--kv-events-endpoint":
            a = f"{flag}=ipc://{tmp_path}/ev.sock"
        if flag == "--kv-events-replay-endpoint":
            a = f"{flag}=ipc://{tmp_path}/rp.sock"
        if flag == "--kv-cache-memory":
            a = f"{flag}=256MiB"  # the test machine, not the pod's request
        args.append(a)
    s = ServerProcess(*args)
    try:
        assert requests.get(s.url + "/health", timeout=5).status_code == 200
        text = requests.get(s.url + "/metrics", timeout=10).text
        names = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", text, re.M))
        pool, epp = docs("inferencepool.yaml")[:2]
        assert pool["kind"] == "InferencePool"
        assert pool["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
        assert pool["spec"]["targetPorts"][0]["number"] == c["ports"][0]["containerPort"]
        wanted = {}
        for a in epp["spec"]["template"]["spec"]["containers"][0]["args"]:
            k, _, v = a.partition("=")
            if k.endswith("-metric") and v:
                wanted[k] = v
        assert len(wanted) == 4, wanted
        for flag, metric in wanted.items():
            assert metric in names, f"{flag}={metric} is not on /metrics"
        assert "smollm2" in text  # --served-model-name from the Deployment
    finally:
        s.stop()
