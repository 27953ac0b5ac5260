"""Prompts of exactly --prompt-tokens tokens as the server counts them (chat template included)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable, Sequence

from qwen27b.tools.bench.common import BenchError

# Words for the prompt filler: common, short, mostly one token each in BPE vocabularies. Each
# request draws its own random sequence (seeded per run), so requests share no prefix beyond the
# chat template and a rerun does not hit the prefix cache of an earlier run.
WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line "
    "end member law car city community name president team minute idea kid body information back "
    "parent face others level office door health person art war history party result change "
    "morning reason research girl guy moment air teacher force education river stone garden "
    "window light music paper table green blue small large early late open short long simple"
).split()
PAD = " a"  # appended to close the last few tokens of the gap; one token in BPE vocabularies


def filler_words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(n)]


def fit_prompt(count: Callable[[str], int], words: Sequence[str], target: int, max_calls: int = 80) -> tuple[str, int]:
    """A text whose token count (as ``count`` measures it, template included) is exactly ``target``.

    Binary search on the number of filler words (the count grows with them), then close the
    last few tokens with one-token pads. ``count`` is the tokenizer or the server's /tokenize.
    """
    calls = 0
    cache: dict[str, int] = {}

    def n(text: str) -> int:
        nonlocal calls
        if text not in cache:
            calls += 1
            if calls > max_calls:
                raise BenchError(f"could not fit a prompt of {target} tokens in {max_calls} tokenizer calls")
            cache[text] = count(text)
        return cache[text]

    def text_of(k: int, pads: int = 0) -> str:
        return " ".join(words[:k]) + PAD * pads

    base = n(text_of(0))
    if base > target:
        raise BenchError(f"the chat template alone is {base} tokens: more than --prompt-tokens {target}")
    lo, hi = 0, min(len(words), max(1, target - base))
    while n(text_of(hi)) < target and hi < len(words):
        lo, hi = hi, min(len(words), hi * 2)
    if n(text_of(hi)) < target:
        raise BenchError(f"{len(words)} filler words give only {n(text_of(hi))} tokens < {target}")
    while hi - lo > 1:  # invariant: n(lo) <= target (or lo == 0), n(hi) >= target
        mid = (lo + hi) // 2
        if n(text_of(mid)) <= target:
            lo = mid
        else:
            hi = mid
    if n(text_of(hi)) == target:
        return text_of(hi), target
    for k in (lo, lo - 1, lo - 2):
        if k < 0:
            break
        pads = target - n(text_of(k))
        for _ in range(6):
            if pads < 0:
                break
            got = n(text_of(k, pads))
            if got == target:
                return text_of(k, pads), target
            pads += target - got
    raise BenchError(f"could not build a prompt of exactly {target} tokens (the tokenizer merges the pads)")


class TokenCounter:
    """Counts prompt tokens the way the server will: local tokenizer or the server's /tokenize."""

    def __init__(self, api: str, model: str, client=None, base: str = "", headers: dict | None = None,
                 tokenizer_dir: str | None = None):
        self.api, self.model, self.client, self.base = api, model, client, base
        self.headers = headers or {}
        self.local = None
        self.name = "server /tokenize"
        if tokenizer_dir:
            self._load_local(tokenizer_dir)

    def _load_local(self, directory: str) -> None:
        try:
            from transformers import AutoTokenizer  # optional: never a controller requirement
            tok = AutoTokenizer.from_pretrained(directory)
            if self.api == "chat":
                def count(text):
                    ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                                  add_generation_prompt=True, tokenize=True)
                    if hasattr(ids, "keys"):
                        ids = ids["input_ids"]
                    return len(ids)
            else:
                def count(text):
                    return len(tok(text)["input_ids"])
            self.local, self.name = count, f"transformers tokenizer ({directory})"
            return
        except ImportError:
            pass
        if self.api == "completions":
            try:
                from tokenizers import Tokenizer
                tok = Tokenizer.from_file(str(Path(directory) / "tokenizer.json"))
                self.local = lambda text: len(tok.encode(text).ids)
                self.name = f"tokenizers ({directory})"
                return
            except Exception:  # noqa: BLE001 - not importable or no tokenizer.json: use the server
                pass
        self.name = ("server /tokenize (transformers not importable here: the chat template needs it)"
                     if self.api == "chat" else "server /tokenize (no local tokenizer importable)")

    def __call__(self, text: str) -> int:
        if self.local:
            return self.local(text)
        body = {"model": self.model}
        if self.api == "chat":
            body.update(messages=[{"role": "user", "content": text}], add_generation_prompt=True)
        else:
            body.update(prompt=text)
        r = self.client.post(f"{self.base}/tokenize", json=body, headers=self.headers)
        if r.status_code != 200:
            raise BenchError(f"POST /tokenize answered {r.status_code}: {r.text[:200]} "
                             "(pass --tokenizer DIR with transformers installed to count locally)")
        data = r.json()
        return int(data.get("count", len(data.get("tokens", []))))
