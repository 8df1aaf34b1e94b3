"""The DELTA section of bench/weights/run.py: delta vs complete disk publication after one real optimizer step.

A Llama-shaped transformers model (fp32 master weights, HF initialisation) takes one AdamW step on a
random batch at each learning rate; the trainer's bf16 export before the step is the base. Complete:
write_version, then the replica reads and verifies it and copies it in (the transformers engine's disk
path: pause = the copy). Delta: write_delta, then stage_delta (read, verify, decode while generating)
and apply_delta (pause = the copy of the changed tensors). Replica checksums of every tensor must equal
the trainer's, or the run stops.
"""

from __future__ import annotations

import gc
import os
import shutil
import time

import torch

# hidden size, layers, vocabulary of the model stepped (~the same shapes as run.py's SHAPES)
MODELS = {"100M": (768, 7, 32000), "10M": (256, 7, 8192)}


def _model(size: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    h, layers, vocab = MODELS[size]
    cfg = LlamaConfig(
        hidden_size=h,
        num_hidden_layers=layers,
        num_attention_heads=h // 64,
        num_key_value_heads=h // 64,
        intermediate_size=8 * h // 3,
        vocab_size=vocab,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).float()


def _export(model) -> list[tuple[str, torch.Tensor]]:
    return [(n, p.detach().to(torch.bfloat16)) for n, p in model.named_parameters()]


def _step(model, lr: float, tokens: int) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=g)
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del opt


def bench_delta(size: str, lrs: list[float], workdir: str, tokens: int = 256) -> list[dict]:
    from meshrl.common.weights import (
        DeltaBase,
        apply_delta,
        apply_to_state,
        read_version,
        stage_delta,
        tensor_checksums,
        write_delta,
        write_version,
    )

    model = _model(size)
    start_state = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = []
    for lr in lrs:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(start_state[n])
        root = os.path.join(workdir, f"delta-{size}-{lr:g}")
        v1 = _export(model)
        base = DeltaBase()
        write_version(root, 1, base.record(1, v1))
        replica = {n: t.clone() for n, t in v1}  # the replica serves v1
        del v1
        _step(model, lr, tokens)
        v2 = _export(model)
        # complete publication of v2
        t0 = time.perf_counter()
        full = write_version(root, 2, v2)
        t1 = time.perf_counter()
        staged = list(read_version(full.path, full.manifest_sha256))
        t2 = time.perf_counter()
        apply_to_state(replica, staged, 1, 2)
        t3 = time.perf_counter()
        full_times = {"publish": t3 - t0, "write": t1 - t0, "stage": t2 - t1, "pause": t3 - t2}
        del staged
        full_bytes = sum(t.numel() * t.element_size() for _, t in v2)
        with torch.no_grad():  # back to v1 for the delta
            for n, t in base.tensors.items():
                replica[n].copy_(t)
        shutil.rmtree(full.path)
        # delta publication of v2 against v1
        gc.collect()
        t0 = time.perf_counter()
        disk, stats = write_delta(root, 2, base, v2, max_fraction=1.0)
        t1 = time.perf_counter()
        sd = stage_delta(replica, disk, current_version=1)
        t2 = time.perf_counter()
        apply_delta(replica, sd)
        t3 = time.perf_counter()
        delta_times = {"publish": t3 - t0, "write": t1 - t0, "stage": t2 - t1, "pause": t3 - t2}
        names = sorted(replica)
        exact = tensor_checksums(replica, names=names) == tensor_checksums(dict(v2), names=names)
        if not exact:
            raise SystemExit(f"delta at lr {lr:g}: replica checksums differ from the trainer's")
        rows.append(
            {
                "lr": lr,
                "full_bytes": full_bytes,
                "delta_bytes": stats.delta_bytes,
                "changed": stats.changed / stats.elements,
                "full": full_times,
                "delta": delta_times,
                "params": stats.elements,
                "exact": exact,
            }
        )
        del sd, v2, base, replica
        shutil.rmtree(root, ignore_errors=True)
        gc.collect()
    return rows


def print_table(title: str, rows: list[dict], steps: tuple[str, str], footer: str) -> None:
    """A delta section's table: bytes, publication time and pause of delta vs complete, then the delta's
    two `steps` (keys of each row's "delta" times, also the column names)."""
    a, b = steps
    print(f"\n{title} ({rows[0]['params']:,} params) in bf16, one AdamW step; seconds")
    print(
        "     lr | changed  delta MiB  full MiB  delta/full | publish: delta  full  ratio | "
        f"pause: delta  full | delta {a:>8} {b:>16} | exact"
    )
    for r in rows:
        d, f = r["delta"], r["full"]
        print(
            f" {r['lr']:>6g} | {r['changed']:>6.1%} {r['delta_bytes'] / 2**20:>10.1f} {r['full_bytes'] / 2**20:>9.0f}"
            f"  {r['delta_bytes'] / r['full_bytes']:>9.2%} | {d['publish']:>14.3f} {f['publish']:>5.3f} "
            f"{d['publish'] / f['publish']:>6.2f} | {d['pause']:>12.4f} {f['pause']:>5.3f} | {d[a]:>14.3f} "
            f"{d[b]:>16.3f} | {r['exact']}"
        )
    print(footer)


def print_delta(size: str, rows: list[dict]) -> None:
    print_table(
        f"DELTA   {size} Llama on disk",
        rows,
        ("write", "stage"),
        "target: delta/full <= 10% (moonshot 3%) at lr 1e-6..1e-5; lr 1e-3 is the tiny default example's.",
    )
