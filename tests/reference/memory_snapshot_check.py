"""Reads a gclab memory snapshot as PyTorch's tools read one (tests/train/trainer_test.cpp runs it):
pickle.load, then torch/cuda/_memory_viz.py's segsum and trace summaries, and the viewer's own pairing of
allocations and frees (filter_alloc_free_pairs). Prints one JSON line: what was found.

  memory_snapshot_check.py SNAPSHOT
"""
import io
import json
import pickle
import sys
from contextlib import redirect_stdout

from torch.cuda import _memory_viz

with open(sys.argv[1], "rb") as f:
    data = pickle.load(f)

segsum = _memory_viz.segsum(data)
trace = _memory_viz.trace(data)
unpaired = io.StringIO()
with redirect_stdout(unpaired):  # "free_completed without free_requested" for every unpaired free
    _memory_viz.filter_alloc_free_pairs(pickle.loads(pickle.dumps(data)))

events = data["device_traces"][0]
live = {}
for e in events:
    if e["action"] == "alloc":
        live[e["addr"]] = e["size"]
    elif e["action"] == "free_completed":
        live.pop(e["addr"], None)
blocks = {b["address"]: b["size"] for s in data["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
print(json.dumps({
    "events": len(events),
    "actions": sorted({e["action"] for e in events}),
    "phases": sorted({fr["name"] for e in events for fr in e["frames"]}),
    "oom_requested": [e["size"] for e in events if e["action"] == "oom"],
    "segments": len(data["segments"]),
    "segment_bytes": sum(s["total_size"] for s in data["segments"]),
    "replayed_live_in_segments": all(blocks.get(a) == n for a, n in live.items()),
    "unpaired_frees": unpaired.getvalue().count("without free_requested"),
    "segsum_ok": segsum.startswith("Summary of segments"),
    "trace_ok": "TOTAL MEM" in trace,
}))
