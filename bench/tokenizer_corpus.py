#!/usr/bin/env python3
"""Writes the tokenizer benchmark corpus (deterministic): license prose from
/usr/share/common-licenses, this repository's C sources as of a pinned commit
(so the corpus does not drift as the code changes), and generated lines of
CJK, Korean, Cyrillic, accents and emoji, repeated to about 2 MB.
Usage: tokenizer_corpus.py OUT ROOT"""
import glob, os, random, subprocess, sys

PINNED = '9bbf065'  # the first tokenizer commit

out, root = sys.argv[1], sys.argv[2]
parts = []
for p in sorted(glob.glob('/usr/share/common-licenses/*')):
    if os.path.isfile(p):
        parts.append(open(p, encoding='utf-8', errors='replace').read())
git = ['git', '-C', root]
names = subprocess.run(git + ['ls-tree', '-r', '--name-only', PINNED, 'src'], check=True,
                       capture_output=True, text=True).stdout.split()
for name in sorted(names):
    parts.append(subprocess.run(git + ['show', f'{PINNED}:{name}'], check=True,
                                capture_output=True, text=True).stdout)
rng = random.Random(20261202)
words = ['日本語', 'テキスト', '中文', '分词', '测试', '你好', '世界', '한국어', '문장', '입니다',
         'Привет', 'как', 'дела', 'café', 'naïve', 'résumé', 'Straße', '😀', '👍🏽', '🇺🇸', '🔥',
         '👨\u200d👩\u200d👧', 'hello', 'world', '12345', '3.14', '∑', '≤', 'π']
lines = []
while sum(len(l) for l in lines) < 300000:
    lines.append(' '.join(rng.choice(words) for _ in range(rng.randint(3, 25))))
parts.append('\n'.join(lines) + '\n')
text = '\n'.join(parts)
# repeat to about 2 MB of UTF-8
data = text.encode('utf-8')
reps = max(1, round(2_000_000 / len(data)))
with open(out, 'wb') as f:
    f.write(data * reps)
