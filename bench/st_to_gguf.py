#!/usr/bin/env python3
"""Writes an lmx checkpoint directory (config.json + bf16 safetensors, e.g.
from `lmx synth`) as a BF16 GGUF file for llama.cpp, with a placeholder
vocabulary (llama-bench feeds token ids, it never tokenizes text).

Usage: PYTHONPATH=$LLAMA/gguf-py /usr/bin/python3 st_to_gguf.py DIR OUT.gguf
Needs numpy and llama.cpp's gguf-py; nothing of llama.cpp is copied here.
Gemma's RMSNorm is (1 + w) * x; llama.cpp expects the 1 folded into the
weights, so every Gemma norm weight gets +1 (rounded to bf16). Norm
vectors are written as float32, as llama.cpp's own converter does.
"""
import glob
import json
import os
import struct
import sys

import numpy as np
import gguf


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        assert info["dtype"] == "BF16", f"{name}: {info['dtype']}, want BF16"
        yield name, data[a:b].view(np.uint16).reshape(info["shape"])


def bf16_plus_one(w):
    f = (w.astype(np.uint32) << 16).view(np.float32) + np.float32(1.0)
    u = f.view(np.uint32)
    u = u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))  # round to nearest even
    return (u >> 16).astype(np.uint16)


def main():
    src, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg = cfg.get("text_config", cfg)
    gemma = cfg["model_type"].startswith("gemma3")
    arch = "gemma3" if gemma else "qwen3"
    w = gguf.GGUFWriter(out, arch)
    L, V = cfg["num_hidden_layers"], cfg["vocab_size"]
    w.add_context_length(min(cfg["max_position_embeddings"], 32768))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg.get("rope_theta", 1e6))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    if gemma:
        w.add_sliding_window(cfg["sliding_window"])
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", cfg.get("sliding_window_pattern", 6))
        w.add_float32(f"{arch}.rope.freq_base_swa", cfg.get("rope_local_base_freq", 10000.0))
    # placeholder vocabulary: <unk> <s> </s>, the 256 byte tokens, then fillers
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += [f"t{i}" for i in range(V - len(toks))]
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (V - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * V)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    names = {
        "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    if gemma:
        names.update({"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                      "post_feedforward_layernorm": "post_ffw_norm"})
    else:
        names["post_attention_layernorm"] = "ffn_norm"
    files = sorted(glob.glob(os.path.join(src, "*.safetensors")))
    for path in files:
        for name, t in read_safetensors(path):
            base = name.replace("model.language_model.", "model.")
            if base == "model.embed_tokens.weight":
                g = "token_embd.weight"
            elif base == "model.norm.weight":
                g = "output_norm.weight"
            elif base == "lm_head.weight":
                g = "output.weight"
            else:
                parts = base.split(".")  # model.layers.I.<module>.weight
                g = f"blk.{parts[2]}.{names['.'.join(parts[3:-1])]}.weight"
            if gemma and g.endswith("norm.weight"):
                t = bf16_plus_one(t)
            if t.ndim == 1:  # llama.cpp keeps vectors (norms) in float32
                w.add_tensor(g, (t.astype(np.uint32) << 16).view(np.float32))
            else:
                w.add_tensor(g, np.ascontiguousarray(t), raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
