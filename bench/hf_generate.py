#!/usr/bin/env python3
"""transformers reference for the GPU benchmarks (issue 6): the same
checkpoint directory lmx and llama.cpp run (e.g. from `lmx synth --like`),
loaded in bf16 with SDPA attention, random token ids.

Prints one JSON line per metric to stdout:
  {"tool": "transformers", "model": NAME, "format": "bf16", "metric": M, "tok_s": X, ...}
with M one of pp<P> (prefill of a P-token prompt), tg (decode from a
1-token prompt) and tg@<D> (decode after a D-token prompt), the names
bench/llama_cpp_gpu.sh uses for llama.cpp's pp512 / tg128 / tg128 at -d D.

Method:
- prefill: one forward pass of the P-token prompt (batch 1, KV cache
  written, logits of the last position only, as generate's prefill does),
  timed with CUDA events, best of --reps after one warm-up pass;
- decode: t1 = time of generate(prompt, max_new_tokens=1) (the prefill and
  the first token), tN = time of generate(prompt, N new tokens), greedy,
  min_new_tokens = max_new_tokens = N so no end-of-sequence token stops it
  early; rate = (N - 1) / (tN - t1): generate N runs the same prefill plus
  N - 1 one-token steps. Each time is the best of --reps (after one warm-up
  generate), wall clock with the device synchronized around it. This is
  plain `generate` with its default (dynamic) cache and no torch.compile:
  what a transformers user gets out of the box, Python overhead included.

Usage:
  python3 bench/hf_generate.py DIR [--name NAME] [--device cuda|cpu]
      [--prompts 512,4096] [--gen 128] [--depth 4096] [--reps 3]
Small CPU check: --device cpu --prompts 8,16 --gen 4 --depth 16 --reps 1
"""
import argparse
import json
import os
import sys
import time

import torch
import transformers


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def load(path, dev):
    """The checkpoint in bf16 with SDPA attention. Gemma3 4B/12B come in the
    multimodal layout (text model under text_config, no vision weights in
    a synthetic checkpoint): AutoModelForCausalLM picks the class the
    config names; missing vision weights are initialised and unused."""
    auto = transformers.AutoModelForCausalLM
    kw = dict(attn_implementation="sdpa", output_loading_info=True)
    try:  # straight onto the device (transformers 5: dtype=, device_map=)
        m, info = auto.from_pretrained(path, dtype=torch.bfloat16, device_map=str(dev), **kw)
    except Exception as e:  # noqa: BLE001 (any refusal: try the old way)
        # older transformers (torch_dtype=) or device_map needing accelerate:
        # load on the host, then move
        print(f"hf_generate: loading on the host first ({type(e).__name__}: {e})", file=sys.stderr)
        m, info = auto.from_pretrained(path, torch_dtype=torch.bfloat16, **kw)
        m = m.to(dev)
    missing = [k for k in info.get("missing_keys", []) if "vision" not in k and "projector" not in k]
    if missing:  # the timings would still hold (random weights), but say so
        print(f"hf_generate: {len(missing)} weights not in the checkpoint, e.g. {missing[:3]}", file=sys.stderr)
    m.eval()
    return m


def vocab_size(m):
    cfg = m.config
    return getattr(cfg, "vocab_size", None) or cfg.get_text_config().vocab_size


def random_ids(n, vocab, dev, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(vocab, 100000), (1, n), generator=g).to(dev)


def forward_kwargs(m):
    # logits of the last position only (a 4096 x 262k float logit matrix would
    # dominate Gemma's prefill); the argument was num_logits_to_keep before 4.50
    import inspect
    params = inspect.signature(m.forward).parameters
    if "logits_to_keep" in params:
        return {"logits_to_keep": 1}
    if "num_logits_to_keep" in params:
        return {"num_logits_to_keep": 1}
    return {}


def prefill_rate(m, ids, dev, reps, kw):
    best = float("inf")
    for rep in range(reps + 1):  # rep 0 warms up
        sync(dev)
        if dev.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            m(input_ids=ids, use_cache=True, **kw)
            e1.record()
            e1.synchronize()
            dt = e0.elapsed_time(e1) / 1e3
        else:
            t0 = time.perf_counter()
            m(input_ids=ids, use_cache=True, **kw)
            dt = time.perf_counter() - t0
        if rep:
            best = min(best, dt)
    return ids.shape[1] / best


def generate_time(m, ids, n, dev, reps):
    args = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True,
                pad_token_id=0, attention_mask=torch.ones_like(ids))
    best = float("inf")
    for _ in range(reps):
        sync(dev)
        t0 = time.perf_counter()
        out = m.generate(ids, **args)
        sync(dev)
        best = min(best, time.perf_counter() - t0)
        assert out.shape[1] == ids.shape[1] + n, out.shape
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--name", help="model name in the output (default: the directory's name)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", default="512,4096", help="prefill prompt lengths")
    ap.add_argument("--gen", type=int, default=128, help="tokens generated per decode run")
    ap.add_argument("--depth", type=int, default=4096, help="prompt length for the second decode run")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    dev = torch.device(a.device)
    name = a.name or os.path.basename(os.path.normpath(a.dir))
    t0 = time.perf_counter()
    m = load(a.dir, dev)
    load_s = time.perf_counter() - t0
    V = vocab_size(m)
    base = {"tool": "transformers", "model": name, "format": "bf16",
            "transformers": transformers.__version__, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "load_s": round(load_s, 2)}

    def emit(metric, rate, **extra):
        print(json.dumps({**base, "metric": metric, "tok_s": round(rate, 3), **extra}), flush=True)

    kw = forward_kwargs(m)
    with torch.inference_mode():
        for p in (int(x) for x in a.prompts.split(",") if x):
            emit(f"pp{p}", prefill_rate(m, random_ids(p, V, dev, p), dev, a.reps, kw), n_prompt=p)
        generate_time(m, random_ids(8, V, dev, 1), 4, dev, 1)  # warm-up
        for depth in (1, a.depth):
            ids = random_ids(depth, V, dev, 7 + depth)
            t1 = generate_time(m, ids, 1, dev, a.reps)
            tn = generate_time(m, ids, a.gen, dev, max(1, min(a.reps, 2)))
            emit("tg" if depth == 1 else f"tg@{depth}", (a.gen - 1) / (tn - t1),
                 n_gen=a.gen, n_depth=depth, t_prefill_s=round(t1, 4), t_generate_s=round(tn, 4))


if __name__ == "__main__":
    main()
