"""meshrl's batch route inside vLLM's API server: a whole batch of token-id requests in one HTTP call, each
submitted straight to the server's engine client (`EngineClient.generate`, what vLLM's own routes call),
their tokens streamed back several requests per line (format: `vllm_batch_wire`).

vLLM's OpenAI layer costs ~4 ms of CPU per request (pydantic models, per-chunk SSE JSON) and one HTTP stream per
request; on a small CPU host that is as much as the engine needs to generate the tokens. This route does what
vLLM's offline `LLM.generate` does per request (a token input, SamplingParams, the engine's output processor),
plus one compact line per streamed step of the batch.

Loaded as a vLLM endpoint plugin (`vllm.plugins.endpoint_plugins`, vLLM 0.32+): the entry point `meshrl` of
meshrl-rollout's package metadata, allowed by VLLM_PLUGINS=meshrl, which `VLLMEngine.launch` sets. Every other
route of the server (pause, resume, collective_rpc, weight versions, abort) stays vLLM's own. Imported only
inside the vLLM environment; the adapter checks for INFO_PATH and names the fix when it is missing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from meshrl.rollout.vllm_batch_wire import (
    BATCH_PATH,
    DONE,
    FORMAT,
    INFO_PATH,
    PLUGIN,
    BatchRefused,
    encode_line,
    finite,
    parse_batch,
)

router = APIRouter()


class MeshrlEndpoints:
    """The endpoint plugin (vLLM's `EndpointPlugin` protocol): adds the routes, keeps the engine client."""

    name = PLUGIN
    required_tasks = ("generate",)

    def attach_router(self, app: FastAPI) -> None:
        app.include_router(router)

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        state.meshrl_engine = engine_client


def refuse(why: str) -> JSONResponse:
    return JSONResponse({"detail": why}, status_code=400)


@router.get(INFO_PATH)
async def info() -> dict[str, Any]:
    from vllm import __version__

    return {"batch_format": FORMAT, "vllm": __version__}


@router.post(BATCH_PATH)
async def generate_batch(raw: Request) -> Response:
    engine = getattr(raw.app.state, "meshrl_engine", None)
    if engine is None:
        return JSONResponse({"detail": "this vLLM server has no engine (a render-only server)"}, status_code=503)
    try:
        body = json.loads(await raw.body())
    except ValueError as exc:
        return refuse(f"the body is not JSON: {exc}")
    try:
        entries, interval = parse_batch(body)
        work = [(rid, prompt, sampling(engine, rid, params, interval)) for rid, prompt, params in entries]
    except BatchRefused as exc:
        return refuse(str(exc))
    return StreamingResponse(stream(engine, work), media_type="application/x-ndjson")


def sampling(engine: Any, rid: str, params: dict[str, Any], interval: int) -> Any:
    """vLLM SamplingParams of one request: its fields as sent, streamed every `interval` tokens as deltas
    (0: its final output only, as the offline engine does)."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    if "output_kind" in params or "stream_interval" in params:
        raise BatchRefused(f"request {rid}: output_kind and stream_interval are set per batch (stream_interval)")
    try:
        out = SamplingParams(**params)
    except Exception as exc:  # noqa: BLE001 - vLLM's own validation, reported to the caller
        raise BatchRefused(f"request {rid}: sampling params refused by vLLM: {type(exc).__name__}: {exc}") from None
    most = engine.vllm_config.scheduler_config.max_num_seqs
    if out.n > most:
        raise BatchRefused(f"request {rid}: n={out.n} is more than the server's max_num_seqs ({most})")
    if interval:
        out.output_kind, out.stream_interval = RequestOutputKind.DELTA, interval
    else:
        out.output_kind = RequestOutputKind.FINAL_ONLY
    return out


async def stream(engine: Any, work: list[tuple[str, list[int], Any]]) -> AsyncIterator[bytes]:
    """Runs every request of the batch at once; yields what is ready as one line whenever something is. A client
    that goes away cancels this generator, which cancels the requests' tasks: vLLM aborts those requests."""
    from vllm.inputs import tokens_input

    ready: list[dict[str, Any]] = []
    wake = asyncio.Event()
    left = len(work)

    async def drive(i: int, rid: str, prompt: list[int], params: Any) -> None:
        nonlocal left
        try:
            async for result in engine.generate(tokens_input(prompt), params, rid):
                ready.extend(item(i, output) for output in result.outputs)
                wake.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as this request's error item
            ready.append({"i": i, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            left -= 1
            wake.set()

    tasks = [asyncio.create_task(drive(i, *entry)) for i, entry in enumerate(work)]
    try:
        while left or ready:
            await wake.wait()
            wake.clear()
            if ready:
                out, ready[:] = list(ready), []
                yield encode_line({"out": out})
        yield encode_line(DONE)
    finally:
        for task in tasks:
            task.cancel()


def item(i: int, output: Any) -> dict[str, Any]:
    """One sample's new tokens (a vLLM CompletionOutput) as a wire item; vLLM's "error" finish is an error."""
    if output.finish_reason == "error":
        return {"i": i, "error": f"vLLM failed sample {output.index} of the request"}
    ids = [int(t) for t in output.token_ids]
    lps = None
    if output.logprobs is not None:
        lps = []
        for token, position in zip(ids, output.logprobs):
            entry = position.get(token) if position is not None else None
            lps.append(finite(entry.logprob) if entry is not None else None)
    spans = output.weight_versions
    versions = [[s.version, s.start, s.end] for s in spans] if spans is not None else None
    return {"i": i, "k": output.index, "ids": ids, "lps": lps, "finish": output.finish_reason, "versions": versions}
