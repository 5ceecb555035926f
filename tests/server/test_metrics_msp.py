"""/metrics for routers: it parses with prometheus_client's parser and carries the Model Server
Protocol names (vLLM's) with the same values as BIE's own series."""
import threading
import time

import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import ServerProcess


def families(s):
    text = requests.get(s.url + "/metrics", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):  # raises on a malformed page
        for sample in fam.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def one(fams, name):
    assert name in fams, sorted(fams)[:50]
    assert len(fams[name]) == 1, fams[name]
    return fams[name][0]


def test_msp_names_match_bie_series_idle_and_busy():
    s = ServerProcess("--max-model-len", "512", "--max-num-seqs", "2", "--kv-cache-memory",
                      "64MiB", "--paged-block-size", "16")
    try:
        f = families(s)
        assert one(f, "vllm:num_requests_running").value == 0
        assert one(f, "vllm:num_requests_waiting").value == 0
        assert one(f, "vllm:kv_cache_usage_perc").value == 0
        info = one(f, "vllm:cache_config_info")
        assert info.value == 1
        assert info.labels["block_size"] == "16"
        assert int(info.labels["num_gpu_blocks"]) > 0
        assert info.labels["model_name"] == "SmolLM2-135M-Instruct.Q4_1"

        # Four long requests on two slots: two run, two wait, KV in use.
        def run():
            requests.post(s.url + "/v1/completions", timeout=120,
                          json={"prompt": "Count to a thousand:", "max_tokens": 300,
                                "ignore_eos": True})

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        deadline = time.time() + 20
        while True:
            f = families(s)
            if one(f, "bie_requests_running").value == 2 and \
                    one(f, "bie_requests_waiting").value == 2:
                break
            assert time.time() < deadline, "never saw 2 running + 2 waiting"
            time.sleep(0.05)
        assert one(f, "vllm:num_requests_running").value == one(f, "bie_requests_running").value
        assert one(f, "vllm:num_requests_waiting").value == one(f, "bie_requests_waiting").value
        usage = one(f, "vllm:kv_cache_usage_perc").value
        assert 0 < usage <= 1
        assert usage == one(f, "bie_kv_usage_ratio").value
        for t in threads:
            t.join()
        f = families(s)
        assert one(f, "vllm:num_requests_running").value == 0
        assert one(f, "vllm:kv_cache_usage_perc").value == 0
    finally:
        s.stop()
