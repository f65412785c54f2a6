"""The fake engine's answers held to vLLM's own pydantic models, in vLLM's Python (the CPU
build's environment, tests/support/real_engine.py): for routes a real vLLM serving the
testbed's tiny model cannot answer (rerank, score, pooling and classify need a pooling
model, audio a Whisper), this is how the contract test compares shapes, with vLLM's
declared answer types instead of its live answers."""

from __future__ import annotations

import json
import subprocess

from gpuroute.testbed.real_vllm import vllm_python

# route's answer -> vLLM's model of it ("module:Name"; a union goes through a TypeAdapter)
V = "vllm.entrypoints."
SCHEMAS = {
    "rerank": V + "pooling.scoring.protocol:RerankResponse",
    "score": V + "pooling.scoring.protocol:ScoreResponse",
    "pooling": V + "pooling.pooling.protocol:PoolingResponse",
    "classify": V + "pooling.classify.protocol:ClassificationResponse",
    "transcription": V + "speech_to_text.transcription.protocol:TranscriptionResponse",
    "transcription verbose": (
        V + "speech_to_text.transcription.protocol:TranscriptionResponseVerbose"
    ),
    "transcription chunk": V + "speech_to_text.transcription.protocol:TranscriptionStreamResponse",
    "translation": V + "speech_to_text.translation.protocol:TranslationResponse",
    "translation chunk": V + "speech_to_text.translation.protocol:TranslationStreamResponse",
    "response": V + "openai.responses.protocol:ResponsesResponse",
    "message": V + "anthropic.protocol:AnthropicMessagesResponse",
    "count_tokens": V + "anthropic.protocol:AnthropicCountTokensResponse",
    "tokenize": V + "serve.tokenize.protocol:TokenizeResponse",
    "detokenize": V + "serve.tokenize.protocol:DetokenizeResponse",
}

CHECK = r'''
import importlib, json, sys
from pydantic import BaseModel, TypeAdapter


def load(spec):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def extras(obj, path=""):
    """Keys a lenient model (extra="allow") kept without declaring them."""
    out = []
    if isinstance(obj, BaseModel):
        out += [f"{path}.{k}" for k in (obj.model_extra or {})]
        for name in type(obj).model_fields:
            out += extras(getattr(obj, name), f"{path}.{name}")
    elif isinstance(obj, (list, tuple)) and obj:
        out += extras(obj[0], f"{path}[0]")
    elif isinstance(obj, dict):
        for key, value in obj.items():
            out += extras(value, f"{path}.{key}")
    return out


def dropped(fake, dump, path=""):
    """Keys the fake sent that vLLM's model does not keep (extra="ignore")."""
    if isinstance(fake, dict) and isinstance(dump, dict):
        out = [f"{path}.{k}" for k in fake if k not in dump]
        for key in (k for k in fake if k in dump):
            out += dropped(fake[key], dump[key], f"{path}.{key}")
        return out
    if isinstance(fake, list) and isinstance(dump, list) and fake and dump:
        return dropped(fake[0], dump[0], path + "[0]")
    return []


def lacking(fake, dump, path=""):
    """Keys vLLM's answer would carry (not null) that the fake's lacks."""
    if isinstance(dump, dict):
        if not isinstance(fake, dict):
            return [f"{path}: not an object"]
        out = []
        for key, value in dump.items():
            if value is None:
                continue
            where = f"{path}.{key}"
            out += [where] if key not in fake else lacking(fake[key], value, where)
        return out
    if isinstance(dump, list) and dump and isinstance(fake, list) and fake:
        return lacking(fake[0], dump[0], path + "[0]")
    return []


report = {}
for name, spec, answer in json.load(sys.stdin):
    target = load(spec)
    try:
        if isinstance(target, type) and issubclass(target, BaseModel):
            obj = target.model_validate(answer)
            dump = obj.model_dump(mode="json", by_alias=True)
        else:
            adapter = TypeAdapter(target)
            obj = adapter.validate_python(answer)
            dump = adapter.dump_python(obj, mode="json", by_alias=True)
    except Exception as exc:
        report[name] = [f"invalid: {exc}"[:3000]]
        continue
    report[name] = sorted(set(extras(obj) + dropped(answer, dump) + lacking(answer, dump)))
print(json.dumps(report))
'''


def check_with_vllm(cases: list[tuple[str, str, object]]) -> dict[str, list[str]]:
    """Each (name, SCHEMAS key, answer) validated by vLLM's model of it: name -> problems
    (invalid, keys vLLM does not declare, keys vLLM would send that the answer lacks)."""
    python = vllm_python()
    assert python is not None, "vLLM is not installed"
    payload = json.dumps([(name, SCHEMAS[kind], answer) for name, kind, answer in cases])
    done = subprocess.run(
        [str(python), "-c", CHECK], input=payload, capture_output=True, text=True,
        timeout=300, env={"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                          "DO_NOT_TRACK": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
