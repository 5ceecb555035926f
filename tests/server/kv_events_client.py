"""A KV-event subscriber for tests: decodes bie-serve's ZMQ frames in vLLM's wire format
(topic, 8-byte big-endian sequence number, msgpack EventBatch) and rebuilds the replica's cached
block set, (medium, block hash) pairs, from BlockStored / BlockRemoved / AllBlocksCleared."""
import threading
import time

try:
    import msgpack
    import zmq
except ImportError as e:  # a missing dependency fails; it does not skip
    raise ImportError(f"the KV-event tests need pyzmq and msgpack ({e}); "
                      "run scripts/setup_pyenv.sh build/.venv-test") from e

END_SEQ = -1


class Rebuilt:
    """Applies event batches in sequence order and checks each one's shape on the way."""

    def __init__(self):
        self.blocks = set()           # (medium, hash)
        self.ever_stored = set()      # hashes stored at some point (parents must be among them)
        self.next_seq = 0
        self.stored = 0
        self.removed = 0
        self.cleared = 0
        self.media = set()
        self.block_sizes = set()
        self.errors = []

    def apply(self, seq, payload):
        if seq < self.next_seq:
            return False  # already applied (live and replayed copies overlap)
        if seq != self.next_seq:
            raise AssertionError(f"gap: expected batch {self.next_seq}, got {seq}")
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        assert isinstance(batch, list) and len(batch) == 3, batch
        ts, events, dp_rank = batch
        assert isinstance(ts, float) and abs(ts - time.time()) < 3600, ts
        assert dp_rank == 0, dp_rank
        assert isinstance(events, list) and events, events
        for ev in events:
            assert isinstance(ev, list) and isinstance(ev[0], str), ev
            tag = ev[0]
            if tag == "BlockStored":
                assert len(ev) == 7, ev
                _, hashes, parent, tokens, block_size, lora_id, medium = ev
                assert hashes and all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes)
                assert lora_id is None
                assert isinstance(medium, str) and medium
                assert len(tokens) == len(hashes) * block_size, (len(tokens), len(hashes))
                if parent is not None and parent not in self.ever_stored:
                    self.errors.append(f"batch {seq}: parent {parent:x} never stored")
                for h in hashes:
                    if (medium, h) in self.blocks:
                        self.errors.append(f"batch {seq}: {medium}/{h:x} stored twice")
                    self.blocks.add((medium, h))
                    self.ever_stored.add(h)
                self.stored += len(hashes)
                self.media.add(medium)
                self.block_sizes.add(block_size)
            elif tag == "BlockRemoved":
                assert len(ev) == 3, ev
                _, hashes, medium = ev
                for h in hashes:
                    if (medium, h) not in self.blocks:
                        self.errors.append(f"batch {seq}: {medium}/{h:x} removed, not held")
                    self.blocks.discard((medium, h))
                self.removed += len(hashes)
            elif tag == "AllBlocksCleared":
                assert len(ev) == 1, ev
                self.blocks.clear()
                self.cleared += 1
            else:
                raise AssertionError(f"unknown event tag {tag!r}")
        self.next_seq = seq + 1
        return True


class Subscriber:
    """SUB socket on a background thread, collecting (topic, seq, payload) frames."""

    def __init__(self, ctx, endpoint, topic_prefix=b"kv@"):
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic_prefix)
        self.sock.setsockopt(zmq.RCVTIMEO, 100)
        self.sock.connect(endpoint)
        self.frames = []
        self.lock = threading.Lock()
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while self.running:
            try:
                topic, seq, payload = self.sock.recv_multipart()
            except zmq.Again:
                continue
            with self.lock:
                self.frames.append((topic, int.from_bytes(seq, "big", signed=True), payload))

    def take(self):
        with self.lock:
            out, self.frames = self.frames, []
        return out

    def close(self):
        self.running = False
        self.thread.join(timeout=5)
        self.sock.close(linger=0)


def replay(ctx, endpoint, start_seq, timeout=10.0):
    """Asks the ROUTER replay socket for every buffered batch from start_seq on."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
        out = []
        while True:
            empty, seq, payload = sock.recv_multipart()  # raises zmq.Again on timeout
            assert empty == b""
            seq = int.from_bytes(seq, "big", signed=True)
            if seq == END_SEQ:
                assert payload == b""
                return out
            out.append((seq, payload))
    finally:
        sock.close(linger=0)
