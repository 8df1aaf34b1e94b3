"""vLLM's own offline engine (`LLM.generate`) on given prompts: the reference the adapter's throughput is
measured against (bench/rollout/vllm_bench.py runs this file with the vLLM environment's interpreter).

Loads the model once and warms it, prints "READY", then for each line read on stdin (a shape name of
PROMPTS.json, {shape name: [prompt token ids, ...]}) generates that shape's prompts once and prints one line
"RESULT " + JSON (vLLM logs to stdout too): {"tokens": generated tokens, "seconds": wall time of the generate}.
So the bench can alternate offline and adapter runs, and both see the same load on a shared host.
Run: $MESHRL_VLLM_PYTHON bench/rollout/vllm_offline.py MODEL PROMPTS.json MAX_TOKENS
"""

from __future__ import annotations

import json
import os
import sys
import time

for key, value in {
    "TORCHDYNAMO_DISABLE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
}.items():
    os.environ.setdefault(key, value)


def main() -> None:
    from vllm import LLM, SamplingParams

    model, prompt_file, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    shapes = {
        name: [{"prompt_token_ids": p} for p in batch] for name, batch in json.loads(open(prompt_file).read()).items()
    }
    llm = LLM(
        model=model,
        dtype="float32",
        enforce_eager=True,
        kv_cache_memory_bytes=256 << 20,
        max_num_seqs=max(len(batch) for batch in shapes.values()),
        seed=0,
    )
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    for batch in shapes.values():
        llm.generate(batch[:4], params, use_tqdm=False)  # warm
    print("READY", flush=True)
    for line in sys.stdin:
        batch = shapes[line.strip()]
        start = time.perf_counter()
        out = llm.generate(batch, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in out)
        print("RESULT " + json.dumps({"tokens": tokens, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
