"""gclab's T5 tokenizer (Debian's libsentencepiece on a spiece.model) against transformers' T5Tokenizer, through
`gclab tokenize`:

  transformers_t5_tokenizer.py GCLAB_EXE WORK_DIR

A SentencePiece unigram model is trained here from a small generated text (no downloads) with T5's special
ids (<pad> 0, </s> 1, <unk> 2), saved as WORK/tokenizer_2/spiece.model; a few hundred varied captions (plain,
unicode, punctuation, digits, repeated and odd whitespace, words the model never saw, long ones cut at the
limit) must get the same ids from `gclab tokenize --component text_encoder_2` as from transformers'
T5Tokenizer.from_pretrained(WORK/tokenizer_2) with padding="max_length", truncation=True, as FLUX's pipeline
calls it. Exit 77 without transformers / sentencepiece / protobuf.
"""
import os
import random
import sys

from tokenizer_check import WORDS, captions, compare, corpus

MAX_LENGTH = 48


def main():
    exe, work = sys.argv[1], sys.argv[2]
    try:
        import google.protobuf  # noqa: F401  (transformers converts the SentencePiece model with it)
        import sentencepiece as spm
        from transformers import T5Tokenizer
    except Exception as e:
        print(f"reference unavailable: {e}", file=sys.stderr)
        sys.exit(77)
    rng = random.Random(0)
    words = WORDS
    os.makedirs(work, exist_ok=True)
    text = os.path.join(work, "corpus.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(corpus(rng)) + "\n")
        f.write("Été café naïve 東京 Zürich 0123456789 . , ! ? ; : ' \" ( ) - — / # & %\n")
    folder = os.path.join(work, "tokenizer_2")
    os.makedirs(folder, exist_ok=True)
    spm.SentencePieceTrainer.train(input=text, model_prefix=os.path.join(folder, "spiece"), vocab_size=120, hard_vocab_limit=False,
                                   model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   character_coverage=0.9995, minloglevel=2)
    reference = T5Tokenizer.from_pretrained(folder, extra_ids=0)
    texts = captions(rng, words)
    want = reference(texts, padding="max_length", max_length=MAX_LENGTH, truncation=True).input_ids
    cut = sum(1 for t in texts if len(reference(t).input_ids) > MAX_LENGTH)
    print(f"{cut} captions cut at {MAX_LENGTH}")
    assert compare(exe, work, "tiny-flux", "text_encoder_2", folder, texts, want, "t5",
                   extra=("--max-length", str(MAX_LENGTH))) == 0

if __name__ == "__main__":
    main()
