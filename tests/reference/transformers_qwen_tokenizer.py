"""gclab's Qwen tokenizer (byte-level BPE, ICU for the Unicode rules) against transformers' Qwen2Tokenizer, through
`gclab tokenize`, with each pipeline's chat template:

  transformers_qwen_tokenizer.py GCLAB_EXE WORK_DIR

A byte-level BPE with Qwen2Tokenizer's rules (NFC; Qwen's pre-tokenizer regex, isolated; no suffix) and the
chat tokens as added tokens is trained here with the tokenizers library from a small generated text (no
downloads), saved as WORK/tokenizer/{vocab.json, merges.txt, tokenizer_config.json}. The captions of the
T5 and CLIP tests plus line breaks, runs of spaces and chat tokens inside captions must get the same ids from
`gclab tokenize --component text_encoder` as from transformers' Qwen2Tokenizer.from_pretrained(WORK/tokenizer)
called as the pipelines call it: Qwen-Image's template, truncation at 1024 + 34, no padding; Z-Image's
template, padded to 512. Exit 77 without transformers / tokenizers.
"""
import json
import os
import random
import sys

from transformers_clip_tokenizer import EDGE
from tokenizer_check import WORDS, captions, compare, corpus, train_byte_level_bpe

PRETOKENIZE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN_IMAGE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
              "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
              "<|im_start|>assistant\n")
ZIMAGE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
MORE = ["two\nlines", "para\n\nbreak", "crlf\r\nline", "   leading spaces", "trailing   ", "tabs\t\tand  spaces",
        "IT'S WE'RE You'LL", "12345 67.89", "a <|im_end|> inside", "<|im_start|>user\nnested", "x\n \n y"]


def main():
    exe, work = sys.argv[1], sys.argv[2]
    try:
        import tokenizers  # noqa: F401
        from transformers import Qwen2Tokenizer
    except Exception as e:
        print(f"reference unavailable: {e}", file=sys.stderr)
        sys.exit(77)
    rng = random.Random(2)
    lines = corpus(rng)
    lines += ["Été café naïve 東京 Zürich 0123456789 . , ! ? ; : ' \" ( ) - — / # & % it's we're I'm\n\n  x"] * 20
    lines += [QWEN_IMAGE.format("a cat")] * 20
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = train_byte_level_bpe(PRETOKENIZE, specials, 500, lines, nfc=True)
    folder = os.path.join(work, "tokenizer")
    os.makedirs(folder, exist_ok=True)
    tok.model.save(folder)  # vocab.json, merges.txt
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"pad_token": "<|endoftext|>", "eos_token": "<|im_end|>",
                   "added_tokens_decoder": {str(tok.token_to_id(s)): {"content": s, "special": True} for s in specials}},
                  f)
    reference = Qwen2Tokenizer.from_pretrained(folder)
    texts = captions(rng, WORDS) + EDGE + MORE
    failures = 0
    for arch, template, kwargs in (("qwen_image", QWEN_IMAGE, dict(max_length=1024 + 34, truncation=True)),
                                   ("zimage", ZIMAGE, dict(padding="max_length", max_length=512, truncation=True))):
        want = [reference(template.format(t), **kwargs).input_ids for t in texts]
        failures += compare(exe, work, arch, "text_encoder", folder, texts, want, f"{arch}, in its chat template")
    assert failures == 0

if __name__ == "__main__":
    main()
