#!/usr/bin/env python3
"""The Hugging Face side of tokenizer_bench.sh: same corpus, same method as
tokenizer_bench.c (load best of 3; encode line by line without special
tokens, best of 3; 1 MB of "a" as one string, best of 3).
Usage: tokenizer_hf.py CORPUS DIR..."""
import sys
import time

from tokenizers import Tokenizer


def best_of(n, fn):
    best = None
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best


text = open(sys.argv[1], encoding='utf-8').read()
# split at '\n' only, newline kept, as tokenizer_bench.c does
parts = text.split('\n')
lines = [p + '\n' for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
size = len(text.encode('utf-8'))
print(f'corpus {sys.argv[1]}: {size / 1e6:.2f} MB')
for d in sys.argv[2:]:
    path = d + '/tokenizer.json'
    load = best_of(3, lambda: Tokenizer.from_file(path))
    tok = Tokenizer.from_file(path)
    count = [0, 0]

    def encode_all():
        n, h = 0, 0
        for l in lines:
            for i in tok.encode(l, add_special_tokens=False).ids:
                h = (h * 31 + i) & 0xFFFFFFFF
                n += 1
        count[0], count[1] = n, h

    enc = best_of(3, encode_all)
    a = 'a' * (1 << 20)
    ta = best_of(3, lambda: tok.encode(a, add_special_tokens=False))
    print(f'{d:40s} load {load * 1e3:7.1f} ms   encode {size / enc / 1e6:6.2f} MB/s '
          f'({count[0]} tokens, ids checksum {count[1]:08x}, {enc:.3f} s)   1 MB of "a" {ta:.3f} s')
