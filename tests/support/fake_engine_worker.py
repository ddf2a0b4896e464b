"""A stand-in for harness/backends/vllm_worker.py: the same JSON-lines protocol, no vLLM, scripted failures.

``FAKE_WORKER`` says how it behaves: ``ok`` (answers every turn with token ids 10, 11, ... up to the budget and
speculative counters when loaded with a speculative_config), ``exit_at_start`` (exits with code 3 before reading),
``fail_load`` (answers the load with an error), ``die_at=N`` (exits during its N-th generate, 1-based),
``garbage_at=N`` (answers its N-th generate with a line that is not JSON), ``hang`` (never answers a generate).
Standard library only, like the real worker.
"""

import json
import os
import sys
import time


def main() -> int:
    mode = os.environ.get("FAKE_WORKER", "ok")
    if mode == "exit_at_start":
        print("fake worker: cannot import vllm", file=sys.stderr)
        return 3
    speculative = False
    turns = 0
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "load":
            if mode == "fail_load":
                reply = {"ok": False, "error": "ValueError: no such model"}
            else:
                speculative = bool(req.get("speculative_config"))
                llm = req.get("llm") or {}  # echoed as the real worker does; the layout as vLLM would resolve it
                tp, pp = llm.get("tensor_parallel_size", 1), llm.get("pipeline_parallel_size", 1)
                parallel = {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "world_size": tp * pp}
                reply = {"ok": True, "version": "0.0-fake", "load_s": 0.0, "config": {"model": req["model"], **llm},
                         "parallel": parallel}
        elif req["op"] == "generate":
            turns += 1
            if mode == f"die_at={turns}":
                print("fake worker: killed mid-turn", file=sys.stderr)
                sys.stderr.flush()
                os._exit(9)
            if mode == f"garbage_at={turns}":
                sys.stdout.write("INFO vLLM says hello\n")
                sys.stdout.flush()
                continue
            if mode == "hang":
                time.sleep(60)
            n = req["max_tokens"]
            counters = {"drafts": 2, "draft_tokens": 4, "accepted_tokens": 3, "accepted_per_pos": [2, 1]} \
                if speculative else dict.fromkeys(("drafts", "draft_tokens", "accepted_tokens", "accepted_per_pos"))
            reply = {"ok": True, "token_ids": list(range(10, 10 + n)), "wall_time_s": 0.01, "ttft_s": 0.002,
                     "finish_reason": "length", "counters": counters,
                     "steps": {"accepted": [2, 1], "drafted": [2, 2]} if speculative else None}
        else:
            print(json.dumps({"ok": True}), flush=True)
            return 0
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
