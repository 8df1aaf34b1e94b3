"""vLLM's own offline engine (`LLM.generate`) on given prompts: the reference the adapter's throughput is
measured against (bench/rollout/vllm_bench.py runs this file with the vLLM environment's interpreter).

Prints one line "RESULT " + JSON (vLLM logs to stdout too): {"tokens": generated tokens per generate,
"seconds": [wall time of each generate]}.
Run: $MESHRL_VLLM_PYTHON bench/rollout/vllm_offline.py MODEL PROMPTS.json MAX_TOKENS REPEATS
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

    model, prompt_file, max_tokens, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    prompts = json.loads(open(prompt_file).read())
    llm = LLM(
        model=model,
        dtype="float32",
        enforce_eager=True,
        kv_cache_memory_bytes=256 << 20,
        max_num_seqs=len(prompts),
        seed=0,
    )
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(inputs[:4], params, use_tqdm=False)  # warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = llm.generate(inputs, params, use_tqdm=False)
        times.append(time.perf_counter() - start)
    tokens = sum(len(o.outputs[0].token_ids) for o in out)
    print("RESULT " + json.dumps({"tokens": tokens, "seconds": times}), flush=True)


if __name__ == "__main__":
    main()
