#!/usr/bin/env python3
"""The Hugging Face side of tokenizer_bench.sh: same corpus, same method
(load best of 3; encode line by line without special tokens, best of 3)."""
import sys, time
from tokenizers import Tokenizer

text = open(sys.argv[1], encoding='utf-8').read()
lines = text.splitlines(keepends=True)
size = len(text.encode('utf-8'))
for d in sys.argv[2:]:
    load = min(_t for _t in (lambda: [(lambda t0: (Tokenizer.from_file(d + '/tokenizer.json'), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(3)])())
    tok = Tokenizer.from_file(d + '/tokenizer.json')
    best, n = 1e9, 0
    for _ in range(3):
        t0 = time.perf_counter()
        n = sum(len(tok.encode(l, add_special_tokens=False).ids) for l in lines)
        best = min(best, time.perf_counter() - t0)
    a = 'a' * (1 << 20)
    t0 = time.perf_counter(); tok.encode(a, add_special_tokens=False); ta = time.perf_counter() - t0
    print(f'{d:40s} load {load*1e3:7.1f} ms   encode {size/best/1e6:6.2f} MB/s ({n} tokens, {best:.3f} s)   1 MB of "a" {ta:.3f} s')
