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
import subprocess
import sys

MAX_LENGTH = 48
# The words the tokenizer tests' corpora and captions are made of (the CLIP test imports them).
WORDS = ("a photo of the cat dog red blue green circle square on in with at night day woman man city street tree sky "
         "painting portrait landscape mountain river golden hour soft light shadow glass water reflection wooden "
         "table old new small large bright dark").split()


def captions(rng, words):
    odd = ["Été", "café", "naïve", "東京", "Zürich", "ångström", "😀", "façade", "€5", "n°3", "Ω", "ß", "İstanbul", "ﬁne"]
    punct = [",", ".", "!", "?", ";", ":", "'", '"', "(", ")", "-", "—", "…", "/", "#", "&", "%"]
    out = ["", " ", "a", "A photo of a cat.", "a  photo   of\ta\ncat", "  leading and trailing  ", "don't stop!",
           "UPPER lower MiXeD", "3.14 and 42, 1e5", "an out-of-vocabulary word: xylophone quokka"]
    for i in range(300):
        n = rng.randint(1, 60 if i % 10 == 0 else 14)
        parts = []
        for _ in range(n):
            r = rng.random()
            parts.append(rng.choice(odd) if r < 0.1 else rng.choice(punct) if r < 0.2 else
                         str(rng.randint(0, 2000)) if r < 0.25 else rng.choice(words).capitalize() if r < 0.35 else
                         rng.choice(words))
        sep = rng.choice([" ", " ", " ", "  ", ", "])
        out.append(sep.join(parts))
    return out


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
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        for _ in range(3000):
            f.write(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "\n")
        f.write("Été café naïve 東京 Zürich 0123456789 . , ! ? ; : ' \" ( ) - — / # & %\n")
    folder = os.path.join(work, "tokenizer_2")
    os.makedirs(folder, exist_ok=True)
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=os.path.join(folder, "spiece"), vocab_size=120, hard_vocab_limit=False,
                                   model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   character_coverage=0.9995, minloglevel=2)
    reference = T5Tokenizer.from_pretrained(folder, extra_ids=0)
    texts = captions(rng, words)
    want = reference(texts, padding="max_length", max_length=MAX_LENGTH, truncation=True).input_ids
    yaml = os.path.join(work, "config.yaml")
    with open(yaml, "w") as f:
        f.write(f"name: tok\ndevice: cpu\nmodel: {{arch: tiny-flux}}\ndatasets: [{{folder_path: {work}}}]\n"
                "train: {steps: 1}\n")
    out = subprocess.run([exe, "tokenize", yaml, "--component", "text_encoder_2", "--tokenizer", folder,
                          "--max-length", str(MAX_LENGTH), "--", *texts], check=True, capture_output=True,
                         text=True).stdout.splitlines()
    assert len(out) == len(texts), f"{len(out)} lines for {len(texts)} captions"
    wrong = [(t, w, o) for t, w, o in zip(texts, want, out) if [int(x) for x in o.split()] != w]
    for t, w, o in wrong[:5]:
        print(f"MISMATCH {t!r}\n  transformers {w}\n  gclab        {o}")
    cut = sum(1 for w in want if w[-1] not in (0,))
    print(f"{len(texts) - len(wrong)} of {len(texts)} captions give transformers' ids ({cut} cut at {MAX_LENGTH})")
    assert not wrong


if __name__ == "__main__":
    main()
