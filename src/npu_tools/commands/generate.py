"""``torch-ir generate``: text (or token ids) in, generated text out, from a checkpoint directory or a zoo LLM.

    torch-ir generate ./Qwen2.5-0.5B --prompt "The capital of France is" --max-new-tokens 32
    torch-ir generate qwen2 --prompt-ids 5,17,42 --max-new-tokens 16 --dtype bfloat16
    torch-ir generate qwen2 --prompt-ids 5,17,42 --max-new-tokens 16 --kv-bits 8     # an int8 KV cache

It builds the model on the meta device, extracts it with a static KV cache, compiles the prefill and
decode programs (``npu_compiler.compile_lm``), reads the weights, and runs ``npu_runtime.Generator``:
tokens are printed as they come, then the timings.
"""

from __future__ import annotations

import argparse
import sys
import time

from npu_compiler.llm import DEFAULT_CHUNK
from npu_tools import cli_options as options


def add_parser(sub: argparse._SubParsersAction) -> None:
    from npu_runtime.backends import BACKENDS

    p = sub.add_parser("generate", help="generate text with an LLM compiled into prefill and decode programs",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json), "
                                  "a GGUF file (llama, qwen2, mistral) or a zoo LLM name (llama, qwen2: random "
                                  "weights, no tokenizer)")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="text, tokenized with the checkpoint's tokenizer")
    prompt.add_argument("--prompt-ids", help="token ids, comma-separated (e.g. 1,2,3)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (default: 32)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="dtype of the weights and the compute (default: the checkpoint's)")
    p.add_argument("--backend", choices=sorted(BACKENDS), default="cpu", help="runtime backend (default: cpu)")
    p.add_argument("--max-cache-len", type=int, default=256, help="KV cache positions (default: 256)")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK,
                   help=f"the smallest prefill bucket in tokens (default: {DEFAULT_CHUNK}); the prefill is compiled "
                        "for it doubled up to --max-cache-len, and a prompt up to the largest runs in one call")
    p.add_argument("--int8-activations", action="store_true",
                   help="a GGUF file's block-quantized layers round their input to int8 groups of 32 first, as "
                        "llama.cpp does: faster Q4_0/Q5_0/Q4_K kernels, results within that rounding (CPU backend)")
    options.kv_bits(p)
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; else sample")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    options.seed(p, default=None)  # the sampling's (none: a fresh draw each run)
    p.set_defaults(func=cmd_generate)


def _prompt_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise SystemExit(f"torch-ir generate: --prompt-ids {text!r} must be comma-separated integers") from None


def _check_early(args: argparse.Namespace) -> None:
    """Refuse what is wrong before minutes of building and compiling: a text prompt for a model without a
    tokenizer, token ids that cannot fit in the cache."""
    from npu_runtime import RuntimeInputError
    from npu_tools.lm_gguf import is_gguf_path
    from torch_ir.frontends.hf_model import is_hf_model_path

    if args.int8_activations and not is_gguf_path(args.source):
        raise RuntimeInputError(f"--int8-activations is for a GGUF file's block-quantized weights; {args.source!r} "
                                "is not a .gguf file: leave the flag out")
    if args.prompt is not None and not (is_hf_model_path(args.source) or is_gguf_path(args.source)):
        raise RuntimeInputError(f"{args.source!r} is a zoo model, which has no tokenizer: give --prompt-ids, or a "
                                "checkpoint directory with tokenizer.json")
    if args.prompt_ids is not None:
        given = len(_prompt_ids(args.prompt_ids))
        need = given + args.max_new_tokens - 1
        if need > args.max_cache_len:
            raise RuntimeInputError(f"a prompt of {given} tokens plus "
                                    f"{args.max_new_tokens} new tokens needs a KV cache of {need} positions; "
                                    f"--max-cache-len is {args.max_cache_len}: raise it or ask for fewer tokens")


def _progress(label: str) -> None:
    """The stage being worked on, on a terminal only (as the other commands' progress bars): piped, a checkpoint
    refused while it loads stays the one stderr line of an error."""
    if sys.stderr.isatty():
        print(f"[{label}]", file=sys.stderr, flush=True)


def cmd_generate(args: argparse.Namespace) -> int:
    from npu_runtime import Device, load_weights
    from npu_runtime.generate import Generator
    from npu_tools.lm_source import load_lm

    _check_early(args)
    started = time.perf_counter()
    device = Device(args.backend)  # before minutes of compiling: a backend that cannot start says so now
    lm = load_lm(args.source, dtype=args.dtype, max_cache_len=args.max_cache_len, chunk=args.chunk,
                 target=device.backend.target, int8_activations=args.int8_activations, progress=_progress,
                 kv_bits=args.kv_bits)
    if args.prompt is not None:
        prompt = lm.tokenizer.encode(args.prompt)
    else:
        prompt = _prompt_ids(args.prompt_ids)
    programs = lm.programs
    generator = Generator(programs.prefill, programs.decode, load_weights(lm.weights, programs.prefill, device),
                          device)
    ready = time.perf_counter() - started
    print(programs.dispatch_table(), file=sys.stderr)
    stream = _Stream(lm.tokenizer, prompt)
    result = generator.generate(prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                                seed=args.seed, eos_token_ids=lm.eos_token_ids, on_token=stream)
    stream.end()
    x = ", int8 activations" if args.int8_activations else ""
    print(f"\n{lm.name} ({lm.dtype}{x}, {args.backend}): loaded and compiled in {ready:.1f} s", file=sys.stderr)
    print(result.summary(), file=sys.stderr)
    return 0


class _Stream:
    """Prints each new token as it comes: the new text when there is a tokenizer (decoding the whole
    continuation each time, so multi-byte characters come out whole), else the id."""

    def __init__(self, tokenizer: object | None, prompt: list[int]) -> None:
        self.tokenizer, self.tokens, self.shown = tokenizer, [], ""
        if tokenizer is None:
            print("prompt ids: " + ",".join(map(str, prompt)))
            print("new ids: ", end="", flush=True)

    def __call__(self, token: int) -> None:
        self.tokens.append(token)
        if self.tokenizer is None:
            print(("," if len(self.tokens) > 1 else "") + str(token), end="", flush=True)
            return
        text = self.tokenizer.decode(self.tokens)
        if text.startswith(self.shown):
            print(text[len(self.shown):], end="", flush=True)
            self.shown = text

    def end(self) -> None:
        print(flush=True)
